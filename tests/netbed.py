"""A multi-host test bed on one Linux machine, made of network namespaces.

Each *host* of the bed is a network namespace with its own loopback and one
interface, ``eth0``, the end of a veth pair whose other end is a port of a
bridge; the bridge lives in a namespace of its own, the *switch*, which also
has an address and is where ``mpiexec`` runs (the "launch node").  Traffic
between two hosts therefore leaves one namespace through a real network
interface, crosses the bridge and enters the other, so it can be shaped with
``tc`` and counted with the interfaces' counters::

    host0 (ns …-h0)             switch (ns …-sw)               host1 (ns …-h1)
    lo, eth0 10.77.0.1  <-veth->  h0 ─┐                 ┌─ h1  <-veth->  eth0 10.77.0.2, lo
                                      br0 10.77.0.254 ──┘
                                      ("launcher")

Nothing is added to the root namespace: the bed is isolated, so its subnet
(``10.77.0.0/24`` unless told otherwise) cannot clash with the machine's own
networks, and several beds can use the same subnet at the same time.  Names are
``rlnb<pid>-<6 hex>-h<i>`` and ``…-sw`` so that concurrent runs never collide and
the leftovers of a crashed run (whose pid is dead) can be recognised and removed
(:func:`cleanup_stale`, called whenever a bed is made).

What the namespaces share and what they don't: TCP ports and abstract Unix
sockets are per namespace; ``/dev/shm``, the file system, the pid space, the
hostname and the boot id are shared, and so are the CPUs unless the bed is made
with ``own_cpus`` (each host's processes then run on a block of CPUs of their own,
through ``taskset``, as on separate machines).  So a host is identified by the
``RINGLET_NODE=host<i>`` variable every command started in it gets, and a test
that wants to prove its traffic went over the network should compare
:meth:`NetBed.counters` before and after (a transport that thinks two ranks share
a machine, because the hostname says so, could use shared memory and never touch
the link).  Each host's ``/etc/hosts`` (through ``/etc/netns/<ns>/hosts``, which
``ip netns exec`` bind-mounts) maps ``host<i>`` and ``launcher`` to their
addresses and the machine's shared hostname to *that host's own address*, like a
real host, so software that resolves its own hostname to find its address gets
the namespace's address and not 127.0.0.1 or the machine's real interface.

Shaping (``rate``, ``delay``): each host's link is shaped in both directions by
putting a qdisc on the egress of *both* ends of its veth pair: ``eth0`` in the
host (the host's upload) and the switch port ``h<i>`` (the host's download).
Egress is the only place a Linux qdisc can queue (ingress can only police), and
the switch port's egress is exactly the host's ingress, so no ifb device is
needed.  A host-to-host packet crosses two links: the sender's ``eth0`` and the
receiver's switch port.  Hence

* a 2-host flow sees ``rate`` in each direction (its data are limited by the
  sender's upload and the receiver's download, its ACKs by the reverse ones);
* two hosts sending to a third together get ``rate``, not twice it (the receiver's
  download is the bottleneck), as on a real switch;
* ``delay`` applies once per link direction, so host-to-host one-way latency is
  ``2 * delay`` and the RTT ``4 * delay`` (plus the bed's own ~50 us).

The qdisc on each end is HTB (one class: ``rate`` with ``ceil = rate`` and a
burst of ~50 us at that rate, at least two frames), with the device's GSO packets
capped at ~100 us of the rate (:func:`gso_segments`: HTB sends a whole GSO packet
at once, so a 64 KB one would cross faster than the link) and, when there is a delay,
a netem leaf under that class (``netem delay D``), so a packet waits ``delay``
and then its turn at ``rate``: propagation plus serialisation, the usual model.
Rate shaping needs only ``sch_htb``; delay needs ``sch_netem``, which some
kernels lack (this module reports exactly why, see :func:`check`).  Rates are tc
rates ("1gbit", "500mbit", in bit/s, SI prefixes) or numbers in bit/s; HTB counts
whole Ethernet frames, so TCP goodput is ~95 % of the rate.

Running things in a host: :meth:`NetBed.popen` / :meth:`NetBed.run` run an
argv with ``ip netns exec <ns>``, in this process's environment (so the venv's
PATH, with ``sys.executable``'s directory put first) plus the host's variables
(:meth:`NetBed.env`).  Jobs across hosts: :meth:`NetBed.torchrun` (one
``torchrun --nnodes K --node-rank i`` per host, the rendezvous on host0's
address) and :meth:`NetBed.mpiexec` (MPICH Hydra in the switch namespace, with
``-launcher ssh -launcher-exec <a generated script>`` whose "ssh" is
``ip netns exec``; see that method for the environment MPICH's network layer
needs to go over ``eth0``).

Usage::

    import netbed
    reason = netbed.check().why_not(rate="1gbit")
    if reason:
        ...skip with reason...
    with netbed.NetBed(2, rate="1gbit") as bed:
        print(bed.measure_throughput(0, 1) / 1e9, "Gbit/s")
        job = bed.torchrun("script.py", nproc_per_node=2)
        print(job.check(timeout=60))

As a command, ``python tests/netbed.py check`` prints what works here,
``python tests/netbed.py measure --rate 1gbit`` builds a 2-host bed and measures
it, ``python tests/netbed.py cleanup`` removes stale beds.  The core uses only
the standard library (no pytest); it needs root, iproute2's ``ip`` and ``tc``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gzip
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "rlnb"
IFNAME = "eth0"
BRIDGE = "br0"
SWITCH_HOST = 254  # the switch's address in the subnet: <subnet>.254, named "launcher"
#: the links' MTU unless a bed is given another (``NetBed(mtu=...)``): Ethernet's
MTU = 1500
#: the Ethernet header a frame adds to a packet of the MTU (HTB counts whole frames)
ETH_HEADER = 14
ETC_NETNS = Path("/etc/netns")
_NAME = re.compile(rf"^{PREFIX}(\d+)-([0-9a-f]{{6}})-(sw|probe|h\d+)$")
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"

#: what MPICH's network layer needs to carry inter-host messages over eth0 (see NetBed.mpiexec)
MPI_ENV = {
    # UCX (the wheel's default netmod): TCP only.  Without this UCX sees the same machine id
    # (hostname, boot id) on both sides and moves inter-"host" messages through shared memory
    # or CMA, bypassing the link.  Intra-host ranks still use MPICH's own shared memory.
    "UCX_TLS": "self,tcp",
    "UCX_NET_DEVICES": IFNAME,
    # libfabric, if the ofi netmod is chosen (MPIR_CVAR_CH4_NETMOD=ofi): its tcp provider on eth0
    "FI_PROVIDER": "tcp",
    "FI_TCP_IFACE": IFNAME,
}


class NetbedError(RuntimeError):
    """A command building, shaping or tearing down the bed failed."""


class JobFailed(RuntimeError):
    """A job's process exited non-zero or timed out; the message holds every process's output."""


# ---------------------------------------------------------------------------------------------
# small helpers


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=_SBIN)


def _ip() -> str:
    return _tool("ip") or "ip"


def _tc() -> str:
    return _tool("tc") or "tc"


def _sh(argv: Sequence[str], *, check: bool = True,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetbedError(f"`{' '.join(argv)}` failed: {e}") from e
    if check and p.returncode != 0:
        raise NetbedError(f"`{' '.join(argv)}` exited {p.returncode}: "
                          f"{(p.stderr or p.stdout).strip()}")
    return p


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}


def parse_rate(rate: str | float) -> float:
    """A tc rate ("1gbit", "500mbit", "100mbps" = bytes/s) or a number of bit/s -> bit/s."""
    if isinstance(rate, int | float):
        return float(rate)
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-z]*)\s*", rate.lower())
    if not m or (m.group(2) or "bit") not in _UNITS:
        raise ValueError(f"not a rate: {rate!r} (say e.g. '1gbit', '500mbit' or bits/s)")
    return float(m.group(1)) * _UNITS[m.group(2) or "bit"]


def parse_delay(delay: str | float) -> float:
    """A tc time ("0.2ms", "200us", "1s") or a number of seconds -> seconds."""
    if isinstance(delay, int | float):
        return float(delay)
    m = re.fullmatch(r"\s*([0-9.]+)\s*(s|sec|ms|msec|us|usec)?\s*", delay.lower())
    if not m:
        raise ValueError(f"not a delay: {delay!r} (say e.g. '0.2ms', '200us' or seconds)")
    scale = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
    return float(m.group(1)) * scale[m.group(2) or "s"]


def _kernel_config(option: str) -> str | None:
    """The kernel's line for ``option`` ("CONFIG_X=y", "# CONFIG_X is not set"), if readable."""
    for path in (Path("/proc/config.gz"), Path(f"/boot/config-{os.uname().release}")):
        try:
            text = (gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz"
                    else path.read_text())
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(f"{option}=") or line == f"# {option} is not set":
                return line
        return f"{option} absent from {path}"
    return None


def _netem_hint(error: str) -> str:
    release = os.uname().release
    parts = [f"tc says: {error!r}."]
    netem, modules = _kernel_config("CONFIG_NET_SCH_NETEM"), _kernel_config("CONFIG_MODULES")
    if netem:
        parts.append(f"Kernel {release}: {netem}")
        if modules:
            parts.append(f"and {modules}" + (" (no loadable modules at all)"
                                             if "is not set" in modules else ""))
        parts[-1] += "."
    if netem is None or netem.endswith("=m"):
        parts.append("Load it with `modprobe sch_netem` (Debian: in linux-image-*; Ubuntu: "
                     f"in linux-modules-extra-{release}); in a container the host must load it.")
    else:
        parts.append("Delay needs a kernel built with CONFIG_NET_SCH_NETEM (=y or =m).")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# can the bed work here?


@dataclass(frozen=True)
class Support:
    """What the bed can do on this machine; each reason is None when that part works."""

    reason: str | None  # why no bed at all (root, iproute2, netns, veth, bridge, ip netns exec)
    rate_reason: str | None  # why no rate shaping (tc, sch_htb)
    delay_reason: str | None  # why no delay (sch_netem)

    def why_not(self, rate: object = None, delay: object = None) -> str | None:
        """The reason a bed with this shaping cannot be built here, or None if it can."""
        if self.reason:
            return self.reason
        if rate is not None and self.rate_reason:
            return self.rate_reason
        if delay is not None and self.delay_reason:
            return self.delay_reason
        return None


_support: Support | None = None


def check(refresh: bool = False) -> Support:
    """Probe (once per process) whether a bed can be built here, in a throw-away namespace."""
    global _support
    if _support is None or refresh:
        _support = _probe()
    return _support


def _probe() -> Support:
    if sys.platform != "linux":
        return Support(f"netbed needs Linux network namespaces (platform {sys.platform})", None,
                       None)
    if os.geteuid() != 0:
        why = (f"netbed needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to create network "
               f"namespaces; this is uid {os.geteuid()}")
        return Support(why, why, why)
    ip, tc = _tool("ip"), _tool("tc")
    if ip is None:
        why = "`ip` not found: install iproute2 (Debian: apt-get install -y iproute2)"
        return Support(why, why, why)
    no_tc = None if tc else "`tc` not found: install iproute2 (Debian: apt-get install -y iproute2)"
    ns = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-probe"
    steps = [
        ([ip, "netns", "add", ns],
         "cannot create a network namespace (kernel without CONFIG_NET_NS, or a container "
         "without CAP_SYS_ADMIN/CAP_NET_ADMIN, or /run/netns not mountable)"),
        ([ip, "netns", "exec", ns, "true"],
         "`ip netns exec` cannot enter the namespace (it needs to unshare the mount "
         "namespace and mount /sys: CAP_SYS_ADMIN)"),
        ([ip, "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"],
         "cannot create a veth pair (kernel without CONFIG_VETH)"),
        ([ip, "-n", ns, "link", "add", "pbr", "type", "bridge"],
         "cannot create a bridge (kernel without CONFIG_BRIDGE)"),
    ]
    try:
        for argv, meaning in steps:
            p = _sh(argv, check=False)
            if p.returncode != 0:
                why = f"{meaning}: `{' '.join(argv)}` said {(p.stderr or p.stdout).strip()!r}"
                return Support(why, why, why)
        if no_tc:
            return Support(None, no_tc, no_tc)
        assert tc is not None
        _sh([ip, "-n", ns, "link", "set", "pa", "up"], check=False)
        rate_reason = None
        htb = [[tc, "-n", ns, "qdisc", "add", "dev", "pa", "root", "handle", "1:", "htb",
                "default", "1"],
               [tc, "-n", ns, "class", "add", "dev", "pa", "parent", "1:", "classid", "1:1",
                "htb", "rate", "1gbit", "ceil", "1gbit", "quantum", "60000"]]
        for argv in htb:
            p = _sh(argv, check=False)
            if p.returncode != 0:
                rate_reason = (f"rate shaping needs the sch_htb qdisc (CONFIG_NET_SCH_HTB): "
                               f"`{' '.join(argv)}` said {(p.stderr or p.stdout).strip()!r}")
                break
        netem = [tc, "-n", ns, "qdisc", "add", "dev", "pb", "root", "netem", "rate", "1gbit",
                 "delay", "0.2ms"]
        p = _sh(netem, check=False)
        if p.returncode != 0 and _tool("modprobe"):
            _sh([_tool("modprobe") or "modprobe", "sch_netem"], check=False)
            p = _sh(netem, check=False)
        delay_reason = None
        if p.returncode != 0:
            delay_reason = ("delay needs the sch_netem qdisc, which does not work here: "
                            + _netem_hint((p.stderr or p.stdout).strip()))
        return Support(None, rate_reason, delay_reason)
    finally:
        _sh([ip, "netns", "del", ns], check=False)


# ---------------------------------------------------------------------------------------------
# clean-up of stale beds


def _netns_names() -> list[str]:
    p = _sh([_ip(), "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _kill_netns_pids(ns: str) -> list[int]:
    """SIGKILL what still runs in one of this module's namespaces (processes a bed started)."""
    p = _sh([_ip(), "netns", "pids", ns], check=False)
    pids = [int(x) for x in p.stdout.split() if x.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def cleanup_stale() -> list[str]:
    """Remove the namespaces, /etc/netns entries and temp dirs of beds whose process is dead."""
    removed: list[str] = []
    if os.geteuid() != 0 or _tool("ip") is None:
        return removed
    for ns in _netns_names():
        m = _NAME.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_netns_pids(ns)
            _sh([_ip(), "netns", "del", ns], check=False)
            removed.append(ns)
    if ETC_NETNS.is_dir():
        for d in ETC_NETNS.iterdir():
            m = _NAME.match(d.name)
            if m and not _pid_alive(int(m.group(1))):
                shutil.rmtree(d, ignore_errors=True)
    tmp = Path(tempfile.gettempdir())
    for d in tmp.glob(f"{PREFIX}*-bed"):
        m = re.match(rf"^{PREFIX}(\d+)-", d.name)
        if m and not _pid_alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)
    return removed


# ---------------------------------------------------------------------------------------------
# jobs


class Job:
    """Processes started together (one per host, or one mpiexec); outputs go to files."""

    def __init__(self, name: str, procs: list[subprocess.Popen[bytes]], outs: list[Path],
                 errs: list[Path]):
        self.name, self.procs, self.outs, self.errs = name, procs, outs, errs

    def stdout(self, i: int = 0) -> str:
        return self.outs[i].read_text(errors="replace")

    def stderr(self, i: int = 0) -> str:
        return self.errs[i].read_text(errors="replace")

    def report(self) -> str:
        parts = []
        for i, p in enumerate(self.procs):
            parts.append(f"--- {self.name}[{i}] pid {p.pid} exit {p.returncode}\n"
                         f"[stdout]\n{self.stdout(i)[-4000:]}\n[stderr]\n{self.stderr(i)[-4000:]}")
        return "\n".join(parts)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)  # each was started in its own session
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)

    def wait(self, timeout: float = 60) -> list[int]:
        """Exit codes; on timeout every process (and its group) is killed and JobFailed raised."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise JobFailed(
                    f"{self.name} timed out after {timeout} s\n{self.report()}") from None
        return [p.returncode for p in self.procs]

    def check(self, timeout: float = 60) -> str:
        """Wait; raise JobFailed if any process failed; return all stdout, concatenated."""
        codes = self.wait(timeout)
        if any(codes):
            raise JobFailed(f"{self.name} failed: exit codes {codes}\n{self.report()}")
        return "".join(self.stdout(i) for i in range(len(self.procs)))


# ---------------------------------------------------------------------------------------------
# the bed


@dataclass(frozen=True)
class Host:
    index: int
    name: str  # "host<i>", also its RINGLET_NODE and its name in every /etc/hosts of the bed
    ns: str  # the network namespace
    ip: str
    port: str  # its port on the switch's bridge (in the switch namespace)
    ifname: str = IFNAME


@dataclass(frozen=True)
class Rtt:
    min: float
    median: float
    samples: int


class NetBed:
    """K hosts on a bridge, each a network namespace; a context manager (see the module doc).

    ``rate``/``delay`` shape every host's link (both directions) from the start; ``shape``
    changes them later.  ``subnet`` is the first three octets; host i is ``<subnet>.<i+1>``,
    the switch ``<subnet>.254``.  ``own_cpus``: every process started in host i runs on
    CPUs of its own (``taskset``: this process's CPUs in k equal blocks), as on separate
    machines, instead of every host sharing all of them; :attr:`cpus` says which (None:
    shared, also when there are fewer CPUs than hosts).
    """

    def __init__(self, k: int = 2, *, rate: str | float | None = None,
                 delay: str | float | None = None, subnet: str = "10.77.0",
                 own_cpus: bool = False, mtu: int = MTU) -> None:
        if not 1 <= k <= 200:
            raise ValueError(f"k must be in 1..200, not {k}")
        if not 1280 <= mtu <= 65535:
            raise ValueError(f"mtu must be in 1280..65535 (IPv6's least, a veth's most), "
                             f"not {mtu}")
        #: every link's MTU: 1500 (Ethernet's), or jumbo frames (9000, as inside many data centres)
        self.mtu = mtu
        why = check().why_not(rate, delay)
        if why:
            raise NetbedError(why)
        cleanup_stale()
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.subnet = subnet
        self.switch_ns = f"{self.tag}-sw"
        self.switch_ip = f"{subnet}.{SWITCH_HOST}"
        self.hosts = [Host(i, f"host{i}", f"{self.tag}-h{i}", f"{subnet}.{i + 1}", f"h{i}")
                      for i in range(k)]
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-", suffix="-bed"))
        mine = sorted(os.sched_getaffinity(0))
        per = len(mine) // k
        #: each host's CPUs (``own_cpus``), or None: every host shares this process's
        self.cpus: list[list[int]] | None = \
            [mine[i * per:(i + 1) * per] for i in range(k)] if own_cpus and per else None
        self._created: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        #: why a shaped link may still burst faster than its rate (None: it does not)
        self.burst_reason: str | None = None
        self._port = 29500
        self._jobs = 0
        self._closed = False
        atexit.register(self.close)
        try:
            self._build()
            if rate is not None or delay is not None:
                self.shape(rate=rate, delay=delay)
        except BaseException:
            self.close()
            raise

    # -- building and tearing down

    def _build(self) -> None:
        ip = _ip()
        sw = self.switch_ns
        self._add_ns(sw)
        for argv in ([ip, "-n", sw, "link", "set", "lo", "up"],
                     [ip, "-n", sw, "link", "add", BRIDGE, "type", "bridge"],
                     [ip, "-n", sw, "addr", "add", f"{self.switch_ip}/24", "dev", BRIDGE],
                     [ip, "-n", sw, "link", "set", BRIDGE, "up"]):
            _sh(argv)
        for h in self.hosts:
            self._add_ns(h.ns)
            for argv in ([ip, "-n", sw, "link", "add", h.port, "mtu", str(self.mtu), "type",
                          "veth", "peer", "name", h.ifname, "mtu", str(self.mtu), "netns", h.ns],
                         [ip, "-n", sw, "link", "set", h.port, "master", BRIDGE, "up"],
                         [ip, "-n", h.ns, "link", "set", "lo", "up"],
                         [ip, "-n", h.ns, "addr", "add", f"{h.ip}/24", "dev", h.ifname],
                         [ip, "-n", h.ns, "link", "set", h.ifname, "up"]):
                _sh(argv)
        names = [("localhost", "127.0.0.1"), ("launcher", self.switch_ip)]
        names += [(h.name, h.ip) for h in self.hosts]
        hostname = socket.gethostname()
        for ns, own in [(sw, self.switch_ip)] + [(h.ns, h.ip) for h in self.hosts]:
            d = ETC_NETNS / ns
            d.mkdir(parents=True, exist_ok=True)
            lines = [f"{addr}\t{name}" for name, addr in names]
            lines.append(f"{own}\t{hostname}")  # this "machine" resolves its hostname to itself
            (d / "hosts").write_text("# netbed: " + ns + "\n" + "\n".join(lines) + "\n")
        self._wait_links()

    def _add_ns(self, ns: str) -> None:
        self._created.append(ns)  # before adding, so a half-made namespace is removed too
        _sh([_ip(), "netns", "add", ns])

    def _wait_links(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        for h in self.hosts:
            while True:
                p = _sh([_ip(), "-n", self.switch_ns, "-j", "-d", "link", "show", h.port])
                info = json.loads(p.stdout)[0]
                state = info.get("linkinfo", {}).get("info_slave_data", {}).get("state")
                if info.get("operstate") == "UP" and state in (None, "forwarding"):
                    break
                if time.monotonic() > deadline:
                    raise NetbedError(f"{h.port} did not come up: {info.get('operstate')}, "
                                      f"{state}")
                time.sleep(0.02)

    def close(self) -> None:
        """Kill what runs in the bed, delete its namespaces and files.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        for ns in self._created:
            _kill_netns_pids(ns)
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        errors = []
        for ns in reversed(self._created):
            q = _sh([_ip(), "netns", "del", ns], check=False)
            if q.returncode != 0 and ns in _netns_names():
                errors.append(f"{ns}: {q.stderr.strip()}")
            shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
        with contextlib.suppress(OSError):
            if ETC_NETNS.is_dir() and not any(ETC_NETNS.iterdir()):
                ETC_NETNS.rmdir()
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        atexit.unregister(self.close)
        if errors:
            raise NetbedError("could not delete " + "; ".join(errors))

    def __enter__(self) -> NetBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- shaping

    def shape(self, rate: str | float | None = None, delay: str | float | None = None,
              hosts: Iterable[int] | None = None) -> None:
        """Set (or, with neither, remove) the shaping of these hosts' links, both directions.

        On each end of a host's veth pair (the host's ``eth0`` = its upload, the switch's
        ``h<i>`` = its download): HTB ``rate`` (ceil = rate, burst ~50 us of it, GSO packets
        of ~100 us: :func:`gso_segments`) and, with a
        delay, a netem leaf ``delay D`` under it; netem alone at the root for a delay with
        no rate.  Host-to-host: bottleneck ``rate``, one-way ``2*delay``, RTT ``4*delay``.
        """
        why = check().why_not(rate, delay)
        if why:
            raise NetbedError(why)
        bps = None if rate is None else parse_rate(rate)
        secs = None if delay is None else parse_delay(delay)
        for i in (range(len(self.hosts)) if hosts is None else hosts):
            h = self.hosts[i]
            for ns, dev in ((h.ns, h.ifname), (self.switch_ns, h.port)):
                why = _shape_dev(ns, dev, bps, secs, self.mtu)
                if why and bps is not None:
                    self.burst_reason = why

    def qdiscs(self, i: int) -> str:
        """``tc -s qdisc`` of both ends of host i's link, for diagnostics."""
        h = self.hosts[i]
        return "\n".join(
            _sh([_tc(), "-n", ns, "-s", "qdisc", "show", "dev", dev], check=False).stdout
            for ns, dev in ((h.ns, h.ifname), (self.switch_ns, h.port)))

    def counters(self, i: int) -> dict[str, int]:
        """Bytes and packets host i's eth0 has sent and received so far."""
        h = self.hosts[i]
        p = _sh([_ip(), "-n", h.ns, "-s", "-j", "link", "show", h.ifname])
        st = json.loads(p.stdout)[0]["stats64"]
        return {"tx_bytes": st["tx"]["bytes"], "rx_bytes": st["rx"]["bytes"],
                "tx_packets": st["tx"]["packets"], "rx_packets": st["rx"]["packets"]}

    # -- running things

    def next_port(self) -> int:
        """A TCP port number not yet handed out by this bed (ports are per namespace, so free)."""
        self._port += 1
        return self._port

    def env(self, i: int) -> dict[str, str]:
        """The variables every command started in host i gets on top of this process's."""
        bindir = os.path.dirname(sys.executable)
        path = os.environ.get("PATH", "")
        return {"RINGLET_NODE": self.hosts[i].name,
                "PATH": path if path.split(os.pathsep)[:1] == [bindir]
                else os.pathsep.join([bindir, path]),
                "GLOO_SOCKET_IFNAME": IFNAME,  # gloo binds to the bed's interface
                "TP_SOCKET_IFNAME": IFNAME}  # tensorpipe (torch rpc) likewise

    def _env(self, base: Mapping[str, str], extra: Mapping[str, str | None] | None
             ) -> dict[str, str]:
        env = dict(base)
        for k, v in (extra or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def _in(self, i: int) -> list[str]:
        """The command that runs what follows it in host i (its namespace, its CPUs)."""
        pin = [] if self.cpus is None else \
            [shutil.which("taskset") or "taskset", "-c", ",".join(map(str, self.cpus[i]))]
        return [_ip(), "netns", "exec", self.hosts[i].ns, *pin]

    def popen(self, i: int, argv: Sequence[str], env: Mapping[str, str | None] | None = None,
              **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in host i (``ip netns exec``); ``env`` adds to (None: removes from)
        this process's environment plus :meth:`env`.  Other keywords go to Popen.  The bed
        kills it on close if it still runs."""
        full = self._env({**os.environ, **self.env(i)}, env)
        p: subprocess.Popen[Any] = subprocess.Popen(
            [*self._in(i), *argv], env=full, **kw)
        self._procs.append(p)
        return p

    def run(self, i: int, argv: Sequence[str], env: Mapping[str, str | None] | None = None,
            timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in host i to completion, output captured as text."""
        full = self._env({**os.environ, **self.env(i)}, env)
        return subprocess.run([*self._in(i), *argv], env=full,
                              capture_output=True, text=True, timeout=timeout, check=check)

    def _job(self, name: str, starts: list[tuple[list[str], list[str], dict[str, str]]]
             ) -> Job:
        self._jobs += 1
        d = self.tmpdir / f"{self._jobs:03d}-{name}"
        d.mkdir()
        procs, outs, errs = [], [], []
        for j, (where, argv, env) in enumerate(starts):
            out, err = d / f"{j}.out", d / f"{j}.err"
            with open(out, "wb") as fo, open(err, "wb") as fe:
                p = subprocess.Popen([*where, *argv], env=env,
                                     stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                                     start_new_session=True)
            self._procs.append(p)
            procs.append(p)
            outs.append(out)
            errs.append(err)
        return Job(name, procs, outs, errs)

    def torchrun(self, script: str | os.PathLike[str], args: Sequence[str] = (), *,
                 nproc_per_node: int = 1, hosts: Sequence[int] | None = None,
                 env: Mapping[str, str | None] | None = None, port: int | None = None,
                 torchrun_args: Sequence[str] = ()) -> Job:
        """One ``torchrun`` per host: ``torchrun --nnodes K --node-rank i --nproc-per-node P
        --master-addr <first host's ip> --master-port <port> script args``, each in its host
        with :meth:`env` (RINGLET_NODE=host<i>, GLOO_SOCKET_IFNAME=eth0) and ``env``.
        (``python -m torch.distributed.run`` is what the ``torchrun`` entry point runs.)"""
        hosts = list(range(len(self.hosts))) if hosts is None else list(hosts)
        port = port or self.next_port()
        starts = []
        for node_rank, i in enumerate(hosts):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
                    "--node-rank", str(node_rank), "--nproc-per-node", str(nproc_per_node),
                    "--master-addr", self.hosts[hosts[0]].ip, "--master-port", str(port),
                    *torchrun_args, os.fspath(script), *args]
            starts.append((self._in(i), argv, self._env({**os.environ, **self.env(i)}, env)))
        return self._job("torchrun", starts)

    def hydra_launcher(self) -> Path:
        """The ``-launcher-exec`` script for Hydra's ssh launcher (written once per bed).

        Hydra calls ``<script> [-x] <host> <proxy command line>``; like sshd, the script runs
        the command line with ``sh -c`` but in the host's namespace, with RINGLET_NODE and
        GLOO_SOCKET_IFNAME set for that host."""
        path = self.tmpdir / "hydra-launch"
        if not path.exists():
            cpus = [""] * len(self.hosts) if self.cpus is None else \
                [f" cpus={','.join(map(str, c))};" for c in self.cpus]
            cases = "\n".join(f"  {h.name}|{h.ip}) ns={h.ns}; node={h.name};{c};"
                               for h, c in zip(self.hosts, cpus, strict=True))
            pin = "" if self.cpus is None else \
                f'{shutil.which("taskset") or "taskset"} -c "$cpus" '
            path.write_text(f"""#!/bin/sh
# netbed {self.tag}: Hydra's "ssh" into a host = ip netns exec into its namespace.
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
case "$host" in
{cases}
  *) echo "netbed hydra launcher: unknown host '$host'" >&2; exit 255;;
esac
export RINGLET_NODE="$node" GLOO_SOCKET_IFNAME={IFNAME} TP_SOCKET_IFNAME={IFNAME}
exec {_ip()} netns exec "$ns" {pin}/bin/sh -c "$*"
""")
            path.chmod(0o755)
        return path

    def mpiexec_argv(self, argv: Sequence[str], *, ppn: int = 1,
                     hosts: Sequence[int] | None = None,
                     mpiexec_args: Sequence[str] = ()) -> list[str]:
        """The Hydra command line :meth:`mpiexec` runs in the switch namespace."""
        hosts = list(range(len(self.hosts))) if hosts is None else list(hosts)
        mpiexec = shutil.which("mpiexec", path=self.env(0)["PATH"]) or "mpiexec"
        return [mpiexec, "-localhost", self.switch_ip,
                "-hosts", ",".join(self.hosts[i].name for i in hosts), "-ppn", str(ppn),
                "-n", str(ppn * len(hosts)), "-launcher", "ssh",
                "-launcher-exec", str(self.hydra_launcher()), *mpiexec_args, *argv]

    def mpiexec(self, argv: Sequence[str], *, ppn: int = 1, hosts: Sequence[int] | None = None,
                env: Mapping[str, str | None] | None = None,
                mpiexec_args: Sequence[str] = ()) -> Job:
        """``mpiexec`` (MPICH Hydra) across the hosts, ``ppn`` ranks on each, ranks in host order.

        How it works: mpiexec runs in the switch namespace ("launcher", <subnet>.254) with
        ``-localhost <that address>`` so that the proxies it starts can call it back (its
        hostname is the machine's, which each host resolves to itself); ``-launcher ssh
        -launcher-exec`` :meth:`hydra_launcher` starts each host's ``hydra_pmi_proxy`` in the
        host's namespace with that host's RINGLET_NODE.  Hydra passes mpiexec's environment
        to the ranks (it must not contain RINGLET_NODE, which would override the hosts'), and
        :data:`MPI_ENV` is added to it: MPICH's ch4 learns which ranks share a node from Hydra
        (by proxy), uses its shared memory within a host and its netmod between hosts; the
        netmod (UCX by default in the wheel) would itself take shared memory/CMA between the
        namespaces, which share the machine id, unless restricted to TCP on eth0."""
        base = {**os.environ, "PATH": self.env(0)["PATH"], **MPI_ENV}
        for k in ("RINGLET_NODE", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            base.pop(k, None)
        full = self._env(base, env)
        return self._job("mpiexec", [([_ip(), "netns", "exec", self.switch_ns], self.mpiexec_argv(
            argv, ppn=ppn, hosts=hosts, mpiexec_args=mpiexec_args), full)])

    # -- measuring

    def _tool_proc(self, i: int, *args: str) -> subprocess.Popen[str]:
        full = {**os.environ, **self.env(i)}
        p = subprocess.Popen([*self._in(i), sys.executable,
                              os.path.abspath(__file__), *args], env=full, text=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        self._procs.append(p)
        return p

    def _server(self, i: int, tool: str, *args: str) -> tuple[int, subprocess.Popen[str]]:
        """Start ``tool`` listening on a fresh port on host i; (port, process) once it
        listens."""
        port = self.next_port()
        p = self._tool_proc(i, tool, str(port), *args)
        assert p.stdout is not None
        if p.stdout.readline().strip() != "listening":
            raise NetbedError(f"{tool} did not start on host {i}: {self._result(p, 10)}")
        return port, p

    @staticmethod
    def _result(p: subprocess.Popen[str], timeout: float) -> dict[str, object]:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise NetbedError(f"measurement timed out: {out} {err}") from None
        if p.returncode != 0:
            raise NetbedError(f"measurement tool exited {p.returncode}: {out} {err}")
        result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
        return result

    def measure_throughput(self, src: int | Sequence[int], dst: int,
                           seconds: float = 1.0) -> float:
        """Bit/s of TCP payload received by host ``dst`` while ``src`` (one host or several,
        one connection each) send as fast as they can for ``seconds``."""
        srcs = [src] if isinstance(src, int) else list(src)
        port, recv = self._server(dst, "_recv", str(len(srcs)))
        sends = [self._tool_proc(s, "_send", self.hosts[dst].ip, str(port), str(seconds))
                 for s in srcs]
        for s in sends:
            self._result(s, seconds + 30)
        r = self._result(recv, 30)
        return float(r["bytes"]) * 8 / float(r["seconds"])  # type: ignore[arg-type]

    def measure_message(self, src: int, dst: int, nbytes: int, count: int = 20,
                        gap: float = 0.01) -> float:
        """Median seconds for host ``src`` to send one message of ``nbytes`` to ``dst`` and
        get a byte back, each after ``gap`` seconds of idle link: at least nbytes / rate
        on a shaped link (plus the round trip), as on a real one (:func:`gso_segments`)."""
        port, sink = self._server(dst, "_sink")
        msg = self._tool_proc(src, "_message", self.hosts[dst].ip, str(port), str(nbytes),
                              str(count), str(gap))
        r = self._result(msg, 60 + count * gap)
        self._result(sink, 10)
        return statistics.median(r["times"])  # type: ignore[arg-type]

    def measure_rtt(self, src: int, dst: int, count: int = 200) -> Rtt:
        """Round trips of 1 byte over one TCP connection (TCP_NODELAY), host src -> dst."""
        port, echo = self._server(dst, "_echo")
        ping = self._tool_proc(src, "_ping", self.hosts[dst].ip, str(port), str(count))
        r = self._result(ping, 60)
        self._result(echo, 10)
        rtts = sorted(r["rtts"])  # type: ignore[call-overload]
        return Rtt(min=rtts[0], median=statistics.median(rtts), samples=len(rtts))


#: the kernel's default limit of segments in one GSO packet
GSO_MAX_SEGS = 65535


def gso_segments(bps: float, mtu: int = MTU) -> int:
    """Segments one GSO packet may carry on a link shaped to ``bps``: about 100 us of the
    rate (1 at 200 Mbit/s, 8 at 1 Gbit/s, 82 at 10 Gbit/s; with jumbo frames, ``mtu``
    9000, 1, 1 and 13).

    HTB lets a packet go whenever its bucket is not empty and charges it after, so a
    64 KB GSO packet (what TCP hands a veth) left at once: with GSO unbounded and a 16 KB
    burst, 16 KiB crossed a 200 Mbit/s link in 0.26 ms (0.39x its 0.66 ms at the rate)
    and 64 KiB in 0.73x, faster than the link.  One segment per packet at 1 Gbit/s costs
    the 2 cores too much (610 Mbit/s of goodput, against 953 with 8)."""
    return max(1, int(bps / 8 * 100e-6) // (mtu + ETH_HEADER))


def _gso_segments(ns: str, dev: str, segs: int | None) -> str | None:
    """Cap (or, with None, restore) the segments per GSO packet of ``dev``.  A kernel that
    does not let a veth's limit be set keeps the default, and the link then lets a GSO
    packet through faster than its rate: returns why (None when it worked)."""
    p = _sh([_ip(), "-n", ns, "link", "set", "dev", dev, "gso_max_segs",
             str(GSO_MAX_SEGS if segs is None else segs)], check=False)
    if p.returncode == 0:
        return None
    return (f"`ip link set dev {dev} gso_max_segs {segs}` failed "
            f"({(p.stderr or p.stdout).strip()}): GSO packets of up to 64 KB cross at once")


def burst_bytes(bps: float, mtu: int = MTU) -> int:
    """What a shaped link lets leave at once after an idle gap: ~50 us of the rate, at
    least two frames (of ``mtu`` bytes and the header)."""
    return max(2 * (mtu + ETH_HEADER), int(bps / 8 * 50e-6))


def _shape_dev(ns: str, dev: str, bps: float | None, secs: float | None,
               mtu: int = MTU) -> str | None:
    """Shape one end of a link; returns why it may still burst (see _gso_segments)."""
    tc = _tc()
    _sh([tc, "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
    bursts = _gso_segments(ns, dev, None if bps is None else gso_segments(bps, mtu))
    if bps is None and secs is None:
        return bursts
    if bps is not None:
        rate = f"{int(bps)}bit"
        burst = burst_bytes(bps, mtu)
        _sh([tc, "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb",
             "default", "1"])
        _sh([tc, "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
             "rate", rate, "ceil", rate, "burst", str(burst), "cburst", str(burst),
             "quantum", "60000"])
    if secs is not None:
        # netem holds every packet for the delay: room for the bandwidth-delay product and more
        pps = (bps if bps is not None else 40e9) / 8 / 1500
        limit = max(1000, int(2 * pps * secs) + 1000)
        where = ["parent", "1:1", "handle", "10:"] if bps is not None else ["root", "handle",
                                                                            "10:"]
        _sh([tc, "-n", ns, "qdisc", "add", "dev", dev, *where, "netem", "delay",
             f"{secs * 1e6:.0f}us", "limit", str(limit)])
    return bursts


# ---------------------------------------------------------------------------------------------
# the measuring tool, run in a host as `python netbed.py _recv|_send|_echo|_ping ...`


def _connect(host: str, port: int, timeout: float = 15) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(64)
    print("listening", flush=True)
    return s


def _tool_recv(port: int, nconn: int) -> None:
    s = _listen(port)
    lock = threading.Lock()
    state = {"bytes": 0, "first": 0.0, "last": 0.0}

    def drain(c: socket.socket) -> None:
        buf = bytearray(1 << 20)
        n, first = 0, 0.0
        while True:
            k = c.recv_into(buf)
            if not k:
                break
            if not first:
                first = time.perf_counter()
            n += k
        last = time.perf_counter()
        with lock:
            state["bytes"] += n
            state["first"] = min(state["first"] or first, first)
            state["last"] = max(state["last"], last)

    threads = []
    for _ in range(nconn):
        c, _addr = s.accept()
        t = threading.Thread(target=drain, args=(c,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    print(json.dumps({"bytes": state["bytes"], "seconds": state["last"] - state["first"]}))


def _tool_send(host: str, port: int, seconds: float) -> None:
    s = _connect(host, port)
    buf = b"\0" * (1 << 20)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        s.sendall(buf)
    s.close()
    print(json.dumps({}))


def _tool_echo(port: int) -> None:
    s = _listen(port)
    c, _addr = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(1)
        if not b:
            break
        c.sendall(b)
    print(json.dumps({}))


def _tool_ping(host: str, port: int, count: int) -> None:
    s = _connect(host, port)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for j in range(count + 10):
        t = time.perf_counter()
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise RuntimeError("echo lost")
        if j >= 10:  # the first few warm up
            rtts.append(time.perf_counter() - t)
    s.close()
    print(json.dumps({"rtts": rtts}))


def _tool_sink(port: int) -> None:
    """Take length-prefixed messages; answer each, once it is all in, with one byte."""
    s = _listen(port)
    c, _addr = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(1 << 20)
    while True:
        head = c.recv(8, socket.MSG_WAITALL)
        if len(head) < 8:
            break
        left = int.from_bytes(head, "little")
        while left:
            k = c.recv_into(buf, min(len(buf), left))
            if not k:
                raise RuntimeError("sender went away mid-message")
            left -= k
        c.sendall(b"x")
    print(json.dumps({}))


def _tool_message(host: str, port: int, nbytes: int, count: int, gap: float) -> None:
    """Send ``count`` messages of ``nbytes``, each after ``gap`` seconds of idle link, and
    time each until the receiver's answer (``_sink``)."""
    s = _connect(host, port)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = nbytes.to_bytes(8, "little") + b"\0" * nbytes
    times = []
    for j in range(count + 3):
        time.sleep(gap)
        t = time.perf_counter()
        s.sendall(data)
        if s.recv(1) != b"x":
            raise RuntimeError("answer lost")
        if j >= 3:  # the first ones open TCP's window
            times.append(time.perf_counter() - t)
    s.close()
    print(json.dumps({"times": times}))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tools = {"_recv": lambda a: _tool_recv(int(a[0]), int(a[1])),
             "_sink": lambda a: _tool_sink(int(a[0])),
             "_message": lambda a: _tool_message(a[0], int(a[1]), int(a[2]), int(a[3]),
                                                 float(a[4])),
             "_send": lambda a: _tool_send(a[0], int(a[1]), float(a[2])),
             "_echo": lambda a: _tool_echo(int(a[0])),
             "_ping": lambda a: _tool_ping(a[0], int(a[1]), int(a[2]))}
    if argv and argv[0] in tools:
        tools[argv[0]](argv[1:])
        return 0
    ap = argparse.ArgumentParser(prog="netbed", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="say what works here")
    m = sub.add_parser("measure", help="build a bed, measure throughput and RTT, tear it down")
    m.add_argument("-k", type=int, default=2)
    m.add_argument("--rate")
    m.add_argument("--delay")
    m.add_argument("--seconds", type=float, default=1.0)
    sub.add_parser("cleanup", help="remove beds left by dead processes")
    a = ap.parse_args(argv)
    if a.cmd == "check":
        s = check()
        print(f"bed:   {s.reason or 'ok'}\nrate:  {s.rate_reason or 'ok (htb)'}\n"
              f"delay: {s.delay_reason or 'ok (netem)'}")
        return 1 if s.reason else 0
    if a.cmd == "cleanup":
        print("\n".join(cleanup_stale()) or "nothing stale")
        return 0
    with NetBed(a.k, rate=a.rate, delay=a.delay) as bed:
        fwd = bed.measure_throughput(0, 1, a.seconds)
        back = bed.measure_throughput(1, 0, a.seconds)
        rtt = bed.measure_rtt(0, 1)
        print(f"host0->host1 {fwd / 1e9:.3f} Gbit/s, host1->host0 {back / 1e9:.3f} Gbit/s, "
              f"RTT min {rtt.min * 1e6:.0f} us median {rtt.median * 1e6:.0f} us")
        if a.k >= 3:
            inc = bed.measure_throughput(list(range(1, a.k)), 0, a.seconds)
            print(f"hosts 1..{a.k - 1} -> host0 together {inc / 1e9:.3f} Gbit/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
