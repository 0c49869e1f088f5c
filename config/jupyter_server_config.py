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
c.ServerApp.root_dir = "/workspace"
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
