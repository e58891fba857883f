# Makes the repository root the pytest rootdir so that `textkit` is importable
# without installing the package.
