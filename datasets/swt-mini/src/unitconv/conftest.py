# Makes the repository root the pytest rootdir so that `unitconv` is
# importable without installing the package.
