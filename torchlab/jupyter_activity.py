"""A Jupyter server extension: while a training run is alive (torchlab.activity's records), the server is active.

Enabled in the image's jupyter_server_config.py; it does nothing where $TORCHLAB_ACTIVITY_DIR is unset (the start
leaves it unset with TRAINING_IS_ACTIVITY=no). While a run lives:
- every POLL_SECONDS, web_app.settings["last_activity_times"] gets the time: jupyter_server's last_activity(),
  which /api/status reports, jupyterhub-singleuser sends to the hub (jupyterhub-idle-culler reads it there) and
  ServerApp.shutdown_no_activity_timeout reads;
- GET /api/kernels lists one more entry, id and name "torchlab-training", execution_state "busy", as Open Data
  Hub's images answer for code-server: Kubeflow's notebook controller (and Open Data Hub's, the same code) counts
  a kernel that is not idle as activity now.
When no run lives, nothing is added, so an idle server is still culled.
"""

import json
import os

from jupyter_core.utils import ensure_async
from jupyter_server._tz import isoformat, utcnow
from jupyter_server.auth.decorator import authorized
from jupyter_server.services.kernels.handlers import MainKernelHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import PeriodicCallback

from torchlab import activity

ENTRY = "torchlab-training"  # its key in last_activity_times, and its kernel entry's id and name
POLL_SECONDS = 10
SETTING = "torchlab_activity"


class TrainingActivity:
    """Reads the live runs; each read that finds one marks the server active now."""

    def __init__(self, folder, settings):
        self.folder, self.settings = folder, settings

    def poll(self):
        runs = activity.live_runs(self.folder)
        if runs:
            self.settings["last_activity_times"][ENTRY] = utcnow()
        return runs


def training_entry():
    """The /api/kernels entry of the live runs: busy now."""
    now = isoformat(utcnow())
    return {"id": ENTRY, "name": ENTRY, "last_activity": now, "execution_state": "busy", "connections": 0}


class KernelsWithTraining(MainKernelHandler):
    """GET /api/kernels: the kernels, and ENTRY while a run lives. POST (start a kernel) is jupyter_server's."""

    @web.authenticated
    @authorized
    async def get(self):
        kernels = await ensure_async(self.kernel_manager.list_kernels())
        if self.settings[SETTING].poll():
            kernels.append(training_entry())
        self.finish(json.dumps(kernels, default=str))


def _jupyter_server_extension_points():
    return [{"module": "torchlab.jupyter_activity"}]


def _load_jupyter_server_extension(serverapp):
    folder = os.environ.get(activity.ACTIVITY_DIR_VARIABLE)
    if not folder:
        return
    settings = serverapp.web_app.settings
    settings[SETTING] = TrainingActivity(folder, settings)
    PeriodicCallback(settings[SETTING].poll, POLL_SECONDS * 1000).start()
    # Added handlers are matched before jupyter_server's own: this one answers GET /api/kernels.
    serverapp.web_app.add_handlers(".*$", [(url_path_join(serverapp.base_url, r"/api/kernels"), KernelsWithTraining)])
    serverapp.log.info("torchlab: training runs in %s count as activity", folder)
