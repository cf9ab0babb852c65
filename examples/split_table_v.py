"""Print CSE-FSL Table V's communication loads and server storage as ``fedge.theory.costs`` computes them.

Each row shows the computed load (GiB, labels not counted) and storage (M parameters) next to the value
printed in the paper, and Table II's literal "server storage" (which leaves out the client copies the
server holds for averaging). Usage: ``python examples/split_table_v.py``
"""

from __future__ import annotations

from fedge.theory.costs import PRINTED_TABLE_V, table_v


def main() -> None:
    print("| dataset | method | h | load GiB (paper) | storage M (paper) | Table II storage M | match |")
    print("|---|---|---|---|---|---|---|")
    for row in table_v():
        key = (row["dataset"], row["method"], row["h"])
        load, storage = PRINTED_TABLE_V[key]
        ok = round(row["load_gib"], 2) == load and round(row["storage_mparams"], 2) == storage
        print(
            f"| {row['dataset']} | {row['method']} | {row['h']} | {row['load_gib']:.4f} ({load:.2f}) | "
            f"{row['storage_mparams']:.4f} ({storage:.2f}) | {row['table2_storage_mparams']:.4f} | "
            f"{'yes' if ok else 'NO'} |"
        )


if __name__ == "__main__":
    main()
