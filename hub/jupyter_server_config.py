"""Jupyter server settings for the labkit course (the hub image copies this to /etc/jupyter/).

The same settings as `make course` (Makefile LAB_FLAGS; tests/test_hub_recipe.py holds the two together):
open the course index first, and shut down kernels left idle with no tab attached, so closed chapters free
their memory (three chapters held ~1.4 GB when they did not). At each start the learner's working copy
~/labkit is made or updated from the image's released course tree ($LABKIT_COURSE_TREE, built by
hub/Dockerfile; labkit.teaching.grading.course_copy): files the learner edited are kept, the course's new version
goes beside them as NAME.update.ipynb.
"""
import os
import sys

c = get_config()  # noqa: F821 - provided by Jupyter when it loads this file

# the learner's working copy of the released course (no solutions): ~/labkit; open its index
c.LabApp.default_url = "/lab/tree/labkit/chapters/index.ipynb"   # LabApp: JupyterLab replaces ServerApp.default_url with its own
c.MappingKernelManager.cull_idle_timeout = 1800   # seconds idle before a kernel is shut down
c.MappingKernelManager.cull_interval = 300        # how often to look
c.MappingKernelManager.cull_connected = False     # only kernels with no open tab

_tree = os.environ.get("LABKIT_COURSE_TREE")
if _tree and os.path.isdir(_tree):
    try:
        from labkit.teaching.grading.course_copy import sync_copy

        print("\n".join(sync_copy(_tree, os.path.join(os.path.expanduser("~"), "labkit")).lines()), file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - the server starts anyway; the log says why the copy is stale
        print(f"labkit: could not update ~/labkit from {_tree}: {type(e).__name__}: {e}", file=sys.stderr)
