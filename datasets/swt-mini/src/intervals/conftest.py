# Makes the repository root the pytest rootdir so that `intervals` is
# importable without installing the package.
