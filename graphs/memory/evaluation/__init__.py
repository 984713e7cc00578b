"""The recall eval's core and its labelled set, shipped in the package for the re-embedding gate."""
