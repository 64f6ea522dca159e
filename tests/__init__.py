"""The test suite: a package, so that tests/helpers imports as `tests.helpers` in the tests and in the
processes they start."""
