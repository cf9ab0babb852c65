"""Many runs at once: sweeps over a grid and seeds, comparisons of algorithms."""
