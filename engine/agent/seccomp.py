"""The box's seccomp filter: a classic-BPF program (what `bwrap --seccomp FD` loads) denying the syscalls a tool
never needs and that widen the kernel's attack surface.

Denied with EPERM: new namespaces (`unshare`, `setns`, `clone` with any `CLONE_NEW*` flag), mounts and the new
mount API, `ptrace` and cross-process memory access, keyrings, `bpf`, `perf_event_open`, `userfaultfd`,
`io_uring`, kernel modules, kexec, reboot, swap, `acct`, file handles (`open_by_handle_at`), `syslog`, `chroot`.
`clone3` answers ENOSYS (its flags sit in memory a filter cannot read), so libc falls back to `clone`, whose
flags it can. A call of another architecture (x32 on x86-64, a foreign `AUDIT_ARCH`) kills the process.
Everything else is allowed: this is a deny-list on top of the namespaces, the uid and the rlimits, not a
policy on its own. Supported: x86-64 and aarch64; elsewhere `program()` is None and the box has no filter.

Layout of `struct seccomp_data`: nr at offset 0, arch at 4, args[i] at 16 + 8 i (the low 32 bits first).
"""

from __future__ import annotations

import errno
import platform
import struct
from functools import lru_cache

_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_CLONE_NEW = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_DENIED = (
    "ptrace process_vm_readv process_vm_writev mount umount2 pivot_root chroot unshare setns keyctl add_key "
    "request_key bpf perf_event_open userfaultfd io_uring_setup io_uring_enter io_uring_register kexec_load "
    "kexec_file_load init_module finit_module delete_module acct swapon swapoff reboot open_by_handle_at "
    "name_to_handle_at syslog fsopen fsconfig fsmount fspick open_tree move_mount mount_setattr"
).split()
_ARCHES = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248,
        "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "acct": 163, "swapon": 167,
        "swapoff": 168, "reboot": 169, "open_by_handle_at": 304, "name_to_handle_at": 303, "syslog": 103,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "open_tree": 428, "move_mount": 429,
        "mount_setattr": 442, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "keyctl": 219, "add_key": 217,
        "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "acct": 89, "swapon": 224,
        "swapoff": 225, "reboot": 142, "open_by_handle_at": 265, "name_to_handle_at": 264, "syslog": 116,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "open_tree": 428, "move_mount": 429,
        "mount_setattr": 442, "clone": 220, "clone3": 435}),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


@lru_cache(maxsize=1)
def program() -> bytes | None:
    """The filter for this machine's architecture, or None where there is none."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit, nr = arch
    deny = [nr[name] for name in _DENIED]
    body: list[bytes] = [_op(_LD_ABS, 4), _op(_JEQ, audit, 1, 0), _op(_RET, _KILL), _op(_LD_ABS, 0)]
    if platform.machine() == "x86_64":
        body += [_op(_JGE, 0x40000000, 0, 1), _op(_RET, _KILL)]  # the x32 ABI
    tail = 6  # a denied nr jumps over the rest of the list and the 6 instructions below to the last (deny)
    for i, n in enumerate(deny):
        body.append(_op(_JEQ, n, len(deny) - i - 1 + tail, 0))
    body += [
        _op(_JEQ, nr["clone3"], 0, 1), _op(_RET, 0x00050000 | errno.ENOSYS),
        _op(_JEQ, nr["clone"], 0, 2), _op(_LD_ABS, 16), _op(_JSET, _CLONE_NEW, 1, 0),
        _op(_RET, _ALLOW),
        _op(_RET, 0x00050000 | errno.EPERM),
    ]
    return b"".join(body)


def memfd() -> int | None:
    """A fresh memfd holding the program at position 0 (bwrap reads it to the end), or None."""
    import os

    prog = program()
    if prog is None:
        return None
    fd = os.memfd_create("asyncrl-seccomp", os.MFD_CLOEXEC)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
