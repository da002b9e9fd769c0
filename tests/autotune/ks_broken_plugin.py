"""A kernel module whose import fails, as a user's module on a host without its dependency."""
raise RuntimeError("this module needs a package that is not installed here")
