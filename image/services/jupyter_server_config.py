# torchlab's Jupyter server settings (current ServerApp / IdentityProvider names).
# The entrypoint chooses the auth: JUPYTER_TOKEN in the environment (jupyter_server reads
# it itself), or an argon2 hash of JUPYTER_PASSWORD in TORCHLAB_JUPYTER_PASSWORD_HASH.
import os

c = get_config()  # noqa: F821  (injected by traitlets when this file is loaded)

c.ServerApp.ip = ""  # every IPv4 and IPv6 address of the container
c.ServerApp.port = int(os.environ.get("JUPYTER_PORT", "8888"))
c.ServerApp.port_retries = 0  # fail loudly instead of drifting to another port
c.ServerApp.open_browser = False
c.ServerApp.allow_root = False
c.ServerApp.root_dir = os.environ.get("TORCHLAB_WORK_DIR", "/workspace")  # the start chooses it
c.ServerApp.disable_check_xsrf = False
c.ServerApp.allow_origin = ""
c.ServerApp.trust_xheaders = False

password_hash = os.environ.get("TORCHLAB_JUPYTER_PASSWORD_HASH", "")
if password_hash:
    c.PasswordIdentityProvider.hashed_password = password_hash
    c.IdentityProvider.token = ""
# With neither a token nor a password the server makes a random token itself:
# there is no configuration of this image that runs Jupyter without auth.
c.PasswordIdentityProvider.allow_password_change = False

# TensorBoard at /tensorboard/ (jupyter-server-proxy): started on the first request, behind the same token or
# password as Jupyter, listening on 127.0.0.1 inside the container only. It reads TENSORBOARD_LOGDIR, else
# TORCHLAB_RUNS (where train.py's run directories are). --load_fast=false: TensorBoard's own reader, with no
# second (data server) process.
tensorboard_logdir = os.environ.get("TENSORBOARD_LOGDIR") or os.environ.get("TORCHLAB_RUNS", "/workspace/runs")
c.ServerProxy.servers = {
    "tensorboard": {
        "command": [
            "tensorboard",
            "--host=127.0.0.1",
            "--port={port}",
            "--path_prefix={base_url}tensorboard",
            f"--logdir={tensorboard_logdir}",
            "--load_fast=false",
        ],
        "absolute_url": True,  # the path reaches TensorBoard whole, as its --path_prefix expects
        "timeout": 60,  # seconds for it to start listening
        "launcher_entry": {"title": "TensorBoard"},
    }
}

# Training runs count as the server's activity for idle cullers (JupyterHub's, Kubeflow's): torchlab.jupyter_activity,
# which does nothing where the start left TORCHLAB_ACTIVITY_DIR unset (TRAINING_IS_ACTIVITY=no).
c.ServerApp.jpserver_extensions.update({"torchlab.jupyter_activity": True})
