"""``python -m cupool ARGS``: runs the ``cupool`` command installed with this package."""

import os
import shutil
import sys
import sysconfig


def _binary():
    names = []
    for scheme in (None, "posix_user", "posix_prefix"):
        try:
            names.append(sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts"))
        except KeyError:
            pass
    for d in names:
        p = os.path.join(d, "cupool")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which("cupool")


def main():
    exe = _binary()
    if exe is None:
        sys.exit("cupool: the cupool executable of this package was not found")
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
