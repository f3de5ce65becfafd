"""Starts one container process inside its namespaces; run by the agent as

    ip netns exec <pod netns> unshare --mount --uts --propagation private \\
        python -I -S launcher.py SPEC.json ERRFD CGROUPFD

so it already is in the pod's network namespace and a fresh mount and UTS namespace
of its own. It joins the container's cgroup (writing its pid to CGROUPFD, the
cgroup's ``cgroup.procs`` opened by the agent), sets the pod's hostname, bind-mounts
each volume (and the pod's /etc/hosts, /etc/resolv.conf, a private /tmp and the
termination-log file) at its path, changes to the working directory and execs the
command with the resolved environment. If anything fails before the exec, it writes
the reason to ERRFD (a close-on-exec pipe: the agent reads EOF on success) and exits 128.

A mask replaces a directory (the root user's home) by a tmpfs that holds only the
listed entries of the original (bind-mounted): the Python installation and the
virtualenv stay, the developer's dotfiles, kubeconfig and ~/.ray do not.

A mount point that does not exist on this machine (e.g. /var/run/secrets/...) is made
without touching the host: its nearest existing ancestor is shadowed, in this mount
namespace only, by a tmpfs that holds a bind mount of each original entry, and the
missing directories are created in the tmpfs.

Standard library only (runs with ``-S``: no site-packages).
"""

import ctypes
import json
import os
import socket
import sys

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
_libc = ctypes.CDLL(None, use_errno=True)


def mount(src, dst, fstype=None, flags=0, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    if _libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} -> {dst} ({fstype or 'bind'}): {os.strerror(err)}")


def fd_path(fd):
    return f"/proc/self/fd/{fd}"


class Mounter:
    def __init__(self):
        self.ours = []  # mount points we made: creating inside them does not touch the host

    def _inside_ours(self, path):
        return any(path == m or path.startswith(m.rstrip("/") + "/") for m in self.ours)

    def _shadow(self, directory, keep=None):
        """Make ``directory`` writable in this mount namespace only, keeping its entries (or those in ``keep``)."""
        # an fd opened before the tmpfs covers the directory still names the original one
        original = os.open(directory, os.O_PATH | os.O_DIRECTORY)
        try:
            mode = os.stat(directory).st_mode & 0o7777
            mount("tmpfs", directory, "tmpfs", 0, f"mode={mode:o}")
            base = fd_path(original)
            for entry in os.listdir(base):
                if keep is not None and entry not in keep:
                    continue
                src, dst = os.path.join(base, entry), os.path.join(directory, entry)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), dst)
                elif os.path.isdir(src):
                    os.mkdir(dst)
                    mount(src, dst, flags=MS_BIND | MS_REC)
                else:
                    open(dst, "w").close()
                    mount(src, dst, flags=MS_BIND)
        finally:
            os.close(original)
        self.ours.append(directory)

    def ensure(self, path, is_dir):
        """Create the mount point ``path`` (a directory or a file); returns its real path."""
        missing = []
        head = path
        while not os.path.lexists(head):
            head, tail = os.path.split(head)
            missing.insert(0, tail)
        head = os.path.realpath(head)
        if not missing:
            return head
        if head == "/":
            raise RuntimeError(f"mount point {path}: /{missing[0]} does not exist on this machine "
                               "(the test node creates mount points only below existing directories)")
        if not self._inside_ours(head):
            self._shadow(head)
        target = os.path.join(head, *missing)
        if is_dir:
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        return target

    def bind(self, src_fd, dst, is_dir, readonly):
        target = self.ensure(dst, is_dir)
        mount(fd_path(src_fd), target, flags=MS_BIND | MS_REC)
        if readonly:
            mount(None, target, flags=MS_REMOUNT | MS_BIND | MS_RDONLY)
        self.ours.append(target)


def main():
    spec = json.loads(open(sys.argv[1]).read())
    errfd, cgroup_fd = int(sys.argv[2]), int(sys.argv[3])
    os.set_inheritable(errfd, False)
    try:
        # the agent opened the cgroup's cgroup.procs for us: `ip netns exec` remounts /sys
        os.write(cgroup_fd, str(os.getpid()).encode())
        os.close(cgroup_fd)
        socket.sethostname(spec["hostname"])
        # open every source first: a later mount (e.g. over /tmp) may hide its path
        mounts = sorted(spec["mounts"], key=lambda m: m["dst"].rstrip("/").count("/"))
        fds = [os.open(m["src"], os.O_PATH) for m in mounts]
        is_dir = [os.path.isdir(m["src"]) for m in mounts]
        mounter = Mounter()
        for mask in spec.get("masks", []):  # e.g. /root: an image's home, not the developer's
            mounter._shadow(mask["dst"], keep=set(mask["keep"]))
        for m, fd, d in zip(mounts, fds, is_dir):
            mounter.bind(fd, m["dst"], d, m.get("readonly", False))
        for fd in fds:
            os.close(fd)
        os.chdir(spec["cwd"])
        argv = spec["argv"]
        if not argv:
            raise RuntimeError("no command: the test node pulls no image, so a container needs `command` or `args`")
        os.execvpe(argv[0], argv, spec["env"])
    except Exception as exc:  # noqa: BLE001 - every failure before exec is reported the same way
        os.write(errfd, f"{type(exc).__name__}: {exc}".encode())
        os._exit(128)


if __name__ == "__main__":
    main()
