"""Print cse-fsl Table V's communication loads and server storage as ``fedge.costs`` computes them.

Each row shows the computed load (GiB, labels not counted) and storage (M parameters) next to the value
printed in the paper, and Table II's literal "server storage" (which leaves out the client copies the
server holds for averaging). Usage: ``python examples/split_table_v.py``
"""

from __future__ import annotations

from fedge.costs import table_v

PRINTED = {  # (load GiB, storage M) as printed in the paper's Table V
    ("cifar10", "splitfed_v1", 1): (172.46, 5.34),
    ("cifar10", "splitfed_v2", 1): (172.46, 1.50),
    ("cifar10", "fsl_an", 1): (86.80, 5.46),
    ("cifar10", "cse_fsl", 5): (18.14, 1.61),
    ("cifar10", "cse_fsl", 10): (9.55, 1.61),
    ("cifar10", "cse_fsl", 25): (4.40, 1.61),
    ("cifar10", "cse_fsl", 50): (2.69, 1.61),
    ("femnist", "splitfed_v1", 1): (36.23, 6.03),
    ("femnist", "splitfed_v2", 1): (36.23, 1.28),
    ("femnist", "fsl_an", 1): (28.16, 8.89),
    ("femnist", "cse_fsl", 2): (19.58, 4.14),
    ("femnist", "cse_fsl", 4): (15.29, 4.14),
    ("femnist", "cse_fsl", 5): (14.43, 4.14),
}


def main() -> None:
    print("| dataset | method | h | load GiB (paper) | storage M (paper) | Table II storage M | match |")
    print("|---|---|---|---|---|---|---|")
    for row in table_v():
        key = (row["dataset"], row["method"], row["h"])
        load, storage = PRINTED[key]
        ok = round(row["load_gib"], 2) == load and round(row["storage_mparams"], 2) == storage
        print(
            f"| {row['dataset']} | {row['method']} | {row['h']} | {row['load_gib']:.4f} ({load:.2f}) | "
            f"{row['storage_mparams']:.4f} ({storage:.2f}) | {row['table2_storage_mparams']:.4f} | "
            f"{'yes' if ok else 'NO'} |"
        )


if __name__ == "__main__":
    main()
