"""bigbatch's test suite: one folder (a package, so that two folders may hold modules of the same name) for each
package of bigbatch/ it tests, cli/ and project/ for the whole; tests/helpers.py is what the modules share,
tests/conftest.py the fixtures, tests/fixtures/ the files they read."""
