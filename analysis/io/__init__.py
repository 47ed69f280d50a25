"""Where data comes from: paths, globs and URLs with their limits, and the data shipped with bia."""
