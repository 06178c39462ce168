"""The test suite: one folder per subpackage of bppsa (core: the flat core modules) and one for the harness."""
