"""Build hook: ship ``data_juicer_elastic.pth`` at the wheel root (regular and editable wheels).

Everything else is declared in setup.cfg. A file at the wheel root lands in
site-packages, where ``site`` runs its ``import`` line at interpreter start;
that line installs the lazy Data-Juicer import hook (data_juicer_elastic.plugin.hook).
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "data_juicer_elastic.pth"
PTH_SOURCE = os.path.join("data_juicer_elastic", "plugin", PTH)


class build_py_with_pth(build_py):
    """Copy the .pth next to the packages: build_lib for a wheel, the wheel root for an editable one."""

    def run(self):
        super().run()
        if self.editable_mode:
            # editable_wheel points install_lib at the unpacked editable wheel; build_lib is discarded
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        self.copy_file(PTH_SOURCE, os.path.join(target, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, PTH))
        return outputs


setup(cmdclass={"build_py": build_py_with_pth})
