"""JupyterHub settings for the labkit course on one machine (a GPU server: one system account per learner).

Used as is by hub/Dockerfile's ``hub`` target (``jupyterhub -f /opt/labkit/hub/jupyterhub_config.py``) and by
tests/test_hub_live.py, which starts this file for real (JupyterHub, configurable-http-proxy, PAM, real system
users) and drives two learners and the instructor through it in Chromium. Learners are the members of the
group ``$LABKIT_HUB_LEARNERS`` (default ``learners``), made with hub/add-learner.sh (home 0700, password);
they log in with their system password (PAM); each server runs as its learner's own account
(LocalProcessSpawner), in their home, and opens the course index of their working copy ``~/labkit``, made or
updated at each start from the released course tree ``$LABKIT_COURSE_TREE`` by hub/jupyter_server_config.py
(the same server settings as ``make course`` and the per-user image). The instructor works as root:
hub/collect.sh, ``labkit grade``, hub/return-feedback.sh (hub/README.md).
"""
import os

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

HERE = os.path.dirname(os.path.abspath(__file__))
LEARNERS = os.environ.get("LABKIT_HUB_LEARNERS", "learners")

# who: the machine's accounts and passwords (PAM); only members of the learners group may log in
c.JupyterHub.authenticator_class = "pam"
c.LocalAuthenticator.allowed_groups = {LEARNERS}
c.LocalAuthenticator.create_system_users = False      # accounts are made by hub/add-learner.sh, never by a login

# where: each learner's server is a process of their own account, rooted in their home
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.notebook_dir = "~"
c.Spawner.default_url = "/lab/tree/labkit/chapters/index.ipynb"   # = LabApp.default_url of the server config
# the server settings of hub/jupyter_server_config.py (working copy ~/labkit, kernel culling), read from
# this folder, and the variables that locate the course: the released tree and the read-only library
c.Spawner.environment = {"JUPYTER_CONFIG_PATH": HERE}
c.Spawner.env_keep = ["PATH", "PYTHONPATH", "LANG", "LC_ALL", "VIRTUAL_ENV",
                      "LABKIT_COURSE_TREE", "LABKIT_ROOT", "JUPYTERHUB_SINGLEUSER_APP"]
c.Spawner.start_timeout = 120      # a loaded machine imports torch slowly
c.Spawner.http_timeout = 120
