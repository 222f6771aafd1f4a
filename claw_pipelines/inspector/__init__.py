"""The trajectory inspector: a web page for curators that reads the Delta tables directly."""
