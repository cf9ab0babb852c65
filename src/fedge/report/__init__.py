"""What the reading commands make of run directories: the HTML report, plots, run names."""
