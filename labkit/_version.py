"""The package version, importable from anywhere in labkit without importing the package face."""
__version__ = "0.2.0"
