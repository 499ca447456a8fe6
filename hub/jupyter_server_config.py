"""Jupyter server settings for the labkit course (the hub image copies this to /etc/jupyter/).

The same settings as `make course` (Makefile LAB_FLAGS; tests/test_hub_recipe.py holds the two together):
open the course index first, and shut down kernels left idle with no tab attached, so closed chapters free
their memory (three chapters held ~1.4 GB when they did not).
"""
c = get_config()  # noqa: F821 - provided by Jupyter when it loads this file

# the learner's copy of the course lands in ~/labkit (nbgitpuller, hub/README.md); open its index
c.LabApp.default_url = "/lab/tree/labkit/chapters/index.ipynb"   # LabApp: JupyterLab replaces ServerApp.default_url with its own
c.MappingKernelManager.cull_idle_timeout = 1800   # seconds idle before a kernel is shut down
c.MappingKernelManager.cull_interval = 300        # how often to look
c.MappingKernelManager.cull_connected = False     # only kernels with no open tab
