"""The package version, in a leaf module so that nothing below the package face imports ``analysis`` itself."""

__version__ = "0.1.0"
