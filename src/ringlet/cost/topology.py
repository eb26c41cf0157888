"""Link and node presets: what the hardware moves, per direction, and where that is written.

Every :class:`LinkSpec` records the per-direction line rate, the headline
("marketing") figure and whether that figure counts both directions, the
per-message latency, the fraction of the line rate collectives achieve, and a
source for each.  The cost model uses ``bandwidth * efficiency`` per direction
and ``latency`` as alpha.

Where the numbers come from
---------------------------
* Line rates: the vendors' specifications.  NVLink 3/4/5 are quoted per GPU
  *bidirectionally* (600, 900, 1800 GB/s), i.e. 300, 450 and 900 GB/s each
  way; PCIe's "64 GB/s" for Gen4 x16 is also both directions (31.5 GB/s each
  way).  InfiniBand and Ethernet rates are per direction (HDR 200 Gb/s =
  25 GB/s each way).
* Efficiency: NCCL's own topology model (``src/graph/topo.h``), which gives the
  bandwidth NCCL plans with per link: 20.0 GB/s per NVLink 3 link, 20.6 per
  NVLink 4 link and 40.1 per NVLink 5 link (of 25, 25 and 50 GB/s line
  rate), 12.0 GB/s for PCIe Gen3 x16 (of 15.75) and 12.0 GB/s for a 100 Gb/s
  NIC (of 12.5).  These constants are independent of the published
  all-reduce results that ``benchmarks/PUBLISHED.md`` compares against.
  Ethernet presets assume TCP: 1448 payload bytes per 1538-byte frame at a
  1500-byte MTU (0.94).
* Latency: NCCL's tuning model (``src/graph/tuning.cc``, ``hwLat``, ring,
  LL128 protocol): 1.9 us per NVLink hop, 2.5 us per PCIe hop, 4.0 us per
  network hop.  Ethernet over kernel TCP sockets is assumed at 25 us per
  message (a typical one-way latency of the kernel stack; not a measurement).
* GPU reductions are fused into NCCL's copy kernels, so GPU presets have
  ``gamma = 0``.
* Per-message overhead (LogGP's ``o``; what a rank pays per message it sends
  or receives in a round, on top of one alpha per round): 1 us per message on
  network links, NCCL's own figure for posting a network operation from its
  proxy thread (``src/graph/tuning.cc``, ``getNetOverhead``, the
  ``NCCL_NET_OVERHEAD`` parameter: 1 us on Intel x86 hosts, 2 us on AMD; the
  tuner charges it once per step of an inter-node ring).  It is the software
  cost, far above the NIC's own message rate (ConnectX-7: hundreds of millions
  of small messages per second, a few ns each), and of the order of the MPI
  LogGP figures Netgauge measures (o_s 0.3-0.5 us, o_r 0.5-1.5 us, g 0.45 us in
  its published example, htor.inf.ethz.ch/research/netgauge/loggp).  Inside a
  node (NVLink, PCIe): 0.4 us per message, NCCL's "arity serialization
  latency" per intra-node peer in its CollNet Direct latency model
  (``tuning.cc``: ``(nRanks/nNodes - 1) * 0.4``), the one place NCCL's tuner
  charges a GPU for talking to more peers at once.  Ethernet over kernel
  sockets: 2 us (NCCL's figure for AMD hosts; a socket send is a system call;
  assumed, not measured).  ``local`` without a calibration: 7 us (what
  calibrations of this transport measure as ``endpoint``,
  benchmarks/VALIDATION.md: 6.9 us at 2 ranks); a calibrated profile carries
  its own.

``local`` is this host's shared memory: the calibrated profile at
:data:`~ringlet.cost.model.DEFAULT_PROFILE_PATH` if there is one, else a
conservative default (20 us per message, 2 GB/s per direction, 2 GB/s of
reduction), documented as an assumption, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ArgumentError
from .model import DEFAULT_PROFILE_PATH, Link, Profile
from .units import format_bandwidth, format_seconds

_NCCL_TOPO = "NCCL src/graph/topo.h"
_NCCL_LAT = "NCCL src/graph/tuning.cc hwLat (ring, LL128)"
_TCP = "TCP goodput at 1500-byte MTU: 1448 payload bytes per 1538 bytes on the wire"
_TCP_LAT = "assumed: one-way latency of kernel TCP sockets, not a measurement"
_NET_OVH = "NCCL src/graph/tuning.cc getNetOverhead (NCCL_NET_OVERHEAD): 1 us per network " \
    "post on an Intel x86 host"
_GPU_OVH = "NCCL src/graph/tuning.cc: 0.4 us arity serialization latency per intra-node peer"
_TCP_OVH = "assumed: a socket send is a system call; NCCL getNetOverhead's 2 us (AMD hosts)"


@dataclass(frozen=True)
class LinkSpec:
    """A preset link: per-direction line rate, headline figure, latency and efficiency."""

    name: str
    description: str
    bandwidth: float          # bytes/s per direction, line rate
    marketing: float          # the headline figure, bytes/s
    bidirectional: bool       # whether the headline figure counts both directions
    latency: float            # seconds per message (alpha)
    efficiency: float         # achievable fraction of the line rate
    source: str               # where the line rate and headline come from
    efficiency_source: str
    latency_source: str
    gamma: float = 0.0        # seconds per byte reduced
    overhead: float = 0.0     # seconds per message at each end (LogGP o)
    overhead_source: str = ""

    @property
    def effective_bandwidth(self) -> float:
        """Bytes/s per direction the model uses: line rate x efficiency."""
        return self.bandwidth * self.efficiency

    def link(self, efficiency: bool = True) -> Link:
        """The cost model's :class:`Link` (``efficiency=False``: the raw line rate)."""
        bw = self.effective_bandwidth if efficiency else self.bandwidth
        eff = f" x {self.efficiency:g} ({self.efficiency_source})" if efficiency else ""
        return Link.from_bandwidth(
            bw, self.latency, self.gamma,
            f"{self.name}: {format_bandwidth(self.bandwidth)} per direction ({self.source})"
            f"{eff}; alpha {format_seconds(self.latency)} ({self.latency_source}); "
            f"{format_seconds(self.overhead)} per message ({self.overhead_source})",
            self.overhead)

    def headline(self) -> str:
        """The marketing figure and what it counts, e.g. ``900 GB/s bidirectional``."""
        kind = "bidirectional" if self.bidirectional else "per direction"
        return f"{format_bandwidth(self.marketing)} {kind}"


@dataclass(frozen=True)
class NodeShape:
    """A node: ``gpus_per_node`` GPUs on ``intra`` links, each with its own ``inter`` NIC."""

    name: str
    description: str
    gpus_per_node: int
    intra: LinkSpec
    inter: LinkSpec
    source: str

    def profile(self, efficiency: bool = True) -> Profile:
        return Profile(self.intra.link(efficiency), self.inter.link(efficiency),
                       self.gpus_per_node, self.name, f"{self.description} ({self.source})")


def _nvlink(name: str, gen: str, gpu: str, links: int, per_link: float, nccl_per_link: float,
            nccl_const: str) -> LinkSpec:
    per_dir = links * per_link
    return LinkSpec(
        name, f"NVLink {gen} ({gpu}, {links} links, through NVSwitch)", per_dir, 2 * per_dir, True,
        1.9e-6, nccl_per_link * 1e9 / per_link,
        f"NVIDIA {gpu} specifications: {links} NVLink {gen} links, "
        f"{format_bandwidth(2 * per_dir)} bidirectional per GPU",
        f"{_NCCL_TOPO} {nccl_const} = {nccl_per_link:g} GB/s per link of {per_link / 1e9:g}",
        _NCCL_LAT, overhead=0.4e-6, overhead_source=_GPU_OVH)


def _pcie(name: str, gen: int, gts: float) -> LinkSpec:
    per_dir = gts * 1e9 * 16 * 128 / 130 / 8   # x16, 128b/130b encoding
    return LinkSpec(
        name, f"PCIe Gen{gen} x16", per_dir, 2 * gts * 16 / 8 * 1e9, True, 2.5e-6,
        12.0 / 15.75,
        f"PCI-SIG: {gts:g} GT/s per lane, 16 lanes, 128b/130b encoding; the usual "
        f"headline counts both directions",
        f"{_NCCL_TOPO} PCI_BW = 12.0 GB/s for Gen3 x16 (15.75 GB/s line rate)", _NCCL_LAT,
        overhead=0.4e-6, overhead_source=_GPU_OVH)


def _net(name: str, description: str, gbits: float, latency: float, source: str,
         latency_source: str = _NCCL_LAT) -> LinkSpec:
    per_dir = gbits * 1e9 / 8
    return LinkSpec(
        name, description, per_dir, per_dir, False, latency, 12.0 / 12.5, source,
        f"{_NCCL_TOPO} NET_BW = 12.0 GB/s for a 100 Gb/s NIC (12.5 GB/s line rate)",
        latency_source, overhead=1e-6, overhead_source=_NET_OVH)


def _eth(name: str, gbits: float) -> LinkSpec:
    per_dir = gbits * 1e9 / 8
    return LinkSpec(
        name, f"{gbits:g} Gb Ethernet, TCP sockets", per_dir, per_dir, False, 25e-6,
        1448 / 1538, f"IEEE 802.3: {gbits:g} Gb/s per direction", _TCP, _TCP_LAT,
        overhead=2e-6, overhead_source=_TCP_OVH)


LINKS: dict[str, LinkSpec] = {s.name: s for s in [
    _nvlink("nvlink3", "3", "A100", 12, 25e9, 20.0, "SM80_NVLINK_BW"),
    _nvlink("nvlink4", "4", "H100 SXM", 18, 25e9, 20.6, "SM90_NVLINK_BW"),
    _nvlink("nvlink5", "5", "B200", 18, 50e9, 40.1, "SM100_NVLINK_BW"),
    _pcie("pcie4", 4, 16.0),
    _pcie("pcie5", 5, 32.0),
    _net("ib_hdr", "InfiniBand HDR, 200 Gb/s per port", 200, 4.0e-6,
         "InfiniBand Trade Association: HDR 4x = 200 Gb/s per direction"),
    _net("ib_ndr", "InfiniBand NDR, 400 Gb/s per port", 400, 4.0e-6,
         "InfiniBand Trade Association: NDR 4x = 400 Gb/s per direction"),
    _net("ib_xdr", "InfiniBand XDR, 800 Gb/s per port", 800, 4.0e-6,
         "InfiniBand Trade Association: XDR 4x = 800 Gb/s per direction"),
    _net("roce200", "RoCE v2 over 200 Gb Ethernet", 200, 5.0e-6,
         "IEEE 802.3: 200 Gb/s per direction",
         f"{_NCCL_LAT} 4.0 us + assumed 1 us for the Ethernet switch"),
    _net("roce", "RoCE v2 over 400 Gb Ethernet", 400, 5.0e-6,
         "IEEE 802.3: 400 Gb/s per direction",
         f"{_NCCL_LAT} 4.0 us + assumed 1 us for the Ethernet switch"),
    _eth("eth10", 10),
    _eth("eth25", 25),
    _eth("eth100", 100),
    _eth("eth400", 400),
]}
LINKS["roce400"] = LINKS["roce"]

#: The conservative default for this host's shared memory, used when no calibrated
#: profile exists: an assumption, not a measurement.
LOCAL_DEFAULT = LinkSpec(
    "local", "this host's shared memory (conservative default: not calibrated)",
    2e9, 2e9, False, 20e-6, 1.0,
    "assumed: a Python shared-memory transport copies at a few GB/s",
    "assumed (efficiency folded into the bandwidth)",
    "assumed: a few polls of a shared-memory flag", gamma=1 / 2e9, overhead=7e-6,
    overhead_source="assumed: calibrations of this transport measure 7-17 us per message "
                    "(the host model's endpoint, benchmarks/VALIDATION.md)")

NODES: dict[str, NodeShape] = {s.name: s for s in [
    NodeShape("dgx_a100", "DGX A100: 8 x A100 on NVLink 3, 8 x 200 Gb/s HDR InfiniBand",
              8, LINKS["nvlink3"], LINKS["ib_hdr"],
              "NVIDIA DGX A100 user guide: 8 single-port ConnectX-6 HDR for compute"),
    NodeShape("dgx_h100", "DGX H100: 8 x H100 on NVLink 4, 8 x 400 Gb/s NDR InfiniBand",
              8, LINKS["nvlink4"], LINKS["ib_ndr"],
              "NVIDIA DGX H100 user guide: 8 ConnectX-7 NDR 400 Gb/s for compute"),
    NodeShape("dgx_b200", "DGX B200: 8 x B200 on NVLink 5, 8 x 400 Gb/s NDR InfiniBand",
              8, LINKS["nvlink5"], LINKS["ib_ndr"],
              "NVIDIA DGX B200 user guide: 8 ConnectX-7 400 Gb/s for compute"),
]}


def names() -> list[str]:
    """Every preset name: links, ``local`` and node shapes."""
    return sorted({*LINKS, "local", *NODES})


def link_spec(name: str) -> LinkSpec:
    """The preset link ``name`` (``local``: the built-in default; see :func:`local_profile`)."""
    key = name.strip().lower().replace("-", "_")
    if key == "local":
        return LOCAL_DEFAULT
    spec = LINKS.get(key)
    if spec is None:
        raise ArgumentError(
            f"unknown link {name!r}; presets: {', '.join(names())} "
            f"(or give --bandwidth and --latency)")
    return spec


def local_profile(path: str | Path | None = None) -> Profile:
    """This host: the calibrated profile at ``path`` (default ``~/.cache/ringlet/profile.json``)
    if it exists, else :data:`LOCAL_DEFAULT` (also for ``path=""``: no profile)."""
    if path == "":
        return Profile(LOCAL_DEFAULT.link(), name="local",
                       source="no profile (RINGLET_PROFILE=''): conservative default")
    p = Path(path if path is not None else DEFAULT_PROFILE_PATH).expanduser()
    if p.is_file():
        return Profile.load(p)
    return Profile(LOCAL_DEFAULT.link(), name="local",
                   source=f"no calibrated profile at {p}: conservative default")


def preset_profile(name: str, efficiency: bool = True,
                   profile_path: str | Path | None = None) -> Profile:
    """A :class:`Profile` for a link preset (one level) or a node shape (two levels)."""
    key = name.strip().lower().replace("-", "_")
    if key in NODES:
        return NODES[key].profile(efficiency)
    if key == "local":
        return local_profile(profile_path)
    spec = link_spec(key)
    return Profile(spec.link(efficiency), name=spec.name, source=spec.source)


def spec_for_bandwidth(bandwidth: float, tolerance: float = 0.01) -> list[LinkSpec]:
    """Presets whose *bidirectional* headline equals ``bandwidth`` (a likely mix-up)."""
    return [s for s in LINKS.values() if s.bidirectional
            and abs(s.marketing - bandwidth) <= tolerance * s.marketing]


# --- published results the presets are checked against ----------------------------------------


@dataclass(frozen=True)
class Published:
    """A published NCCL all-reduce bus bandwidth and how ringlet predicts and simulates the
    same run.

    ``nccl`` says how NCCL ran (``NCCL_ALGO=Ring``, its defaults, ...) as far as the source
    says.  ``miss`` is empty for a row the model should meet within 15 %; otherwise it says
    why it does not (``tests/test_cost.py`` checks both ways).
    """

    system: str
    busbw: float              # published, bytes/s
    source: str
    url: str
    link: str                 # preset or node shape
    nranks: int
    algorithm: str = "ring"
    rails: bool = False
    nbytes: int = 8 * 2**30   # nccl-tests' usual largest size (-e 8G)
    nccl: str = "not stated"
    miss: str = ""

    @property
    def size(self) -> str:
        """``nbytes`` as ``--bytes`` takes it (``8GiB``)."""
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
            if self.nbytes % scale == 0:
                return f"{self.nbytes // scale}{unit}"
        return str(self.nbytes)

    @property
    def shape(self) -> str:
        """``nodes x GPUs`` for a node shape, ``ranks`` for one level."""
        node = NODES.get(self.link)
        if node is None:
            return f"{self.nranks} ranks"
        return f"{-(-self.nranks // node.gpus_per_node)} x {node.gpus_per_node}"

    def command(self, tool: str = "predict") -> str:
        """The ``ringlet predict`` (or ``simulate``) command for this row."""
        rails = " --rails" if self.rails else ""
        return (f"ringlet {tool} all_reduce --bytes {self.size} --ranks {self.nranks} --link "
                f"{self.link} --algorithm {self.algorithm}{rails}")

    def predicted(self, efficiency: bool = True) -> float:
        """The model's busbw (bytes/s), as ``ringlet predict`` gives it."""
        from .model import predict

        return predict("all_reduce", self.algorithm, self.nranks, self.nbytes,
                       preset_profile(self.link, efficiency), "float32",
                       rails=self.rails).busbw

    def simulated(self) -> float:
        """The simulator's busbw (bytes/s), as ``ringlet simulate`` gives it: its time,
        converted as nccl-tests converts (``S / t * 2 (p-1) / p``)."""
        from ..sim import Topology, simulate
        from .model import bus_factor

        res = simulate("all_reduce", self.algorithm, self.nranks, self.nbytes,
                       Topology.from_profile(preset_profile(self.link)), rails=self.rails)
        return self.nbytes / res.seconds * bus_factor("all_reduce", self.nranks)


_DEFAULTS_MISS = ("NCCL's defaults on this cluster: the same nodes reach 391 GB/s (8 nodes) "
                  "with NCCL_MIN_CTAS=24 NCCL_IB_QPS_PER_CONNECTION=2, the settings NVIDIA "
                  "suggested in the thread for getting closer to the 400 GB/s of 8 NDR NICs "
                  "(more thread blocks, one per channel, and more queue pairs per connection, at a "
                  "cost in SMs the application loses); "
                  "ringlet models links, not the thread blocks that drive them")

PUBLISHED: tuple[Published, ...] = (
    Published("8 x H100 SXM, NVLink 4 (ring)", 370e9,
              "NVIDIA/nccl-tests#212, @sjeaugey (NVIDIA), 2024-05-06: \"450GB/s is the line "
              "rate. With the protocol overhead (~20%) NCCL can get an effective NVLink "
              "bandwidth of 370GB/s ... when running with NCCL_ALGO=RING\"",
              "https://github.com/NVIDIA/nccl-tests/issues/212",
              "nvlink4", 8, nccl="NCCL_ALGO=RING"),
    Published("8 x A100 SXM, NVLink 3 (ring)", 232.5e9,
              "NVIDIA/nccl-tests#175, 2023-10-29: all_reduce_perf -b 8 -e 4G -f 2 -g 8 on one "
              "A100 node: 232.54 GB/s",
              "https://github.com/NVIDIA/nccl-tests/issues/175",
              "nvlink3", 8, nccl="defaults"),
    Published("DGX A100, 4 nodes, 8 x 200 Gb/s HDR each (ring)", 192e9,
              "NVIDIA/nccl#812, @AddyLaddy (NVIDIA), 2023-03-31: \"On an Nvidia DGX-A100 "
              "system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW\"",
              "https://github.com/NVIDIA/nccl/issues/812",
              "dgx_a100", 32, rails=True),
    Published("HDR 200 Gb/s, one NIC per node (ring)", 24e9,
              "NVIDIA/nccl#412, @sjeaugey (NVIDIA), 2023-04-24: \"you should get ... 24GB/s "
              "inter-node\" (BusBW at 8G, one HDR NIC)",
              "https://github.com/NVIDIA/nccl/issues/412",
              "ib_hdr", 2),
    Published("NDR 400 Gb/s, one NIC per node (ring)", 47e9,
              "NVIDIA/nccl-tests#290, @AddyLaddy (NVIDIA), 2025-03-03: \"For NDR @ 400Gbps "
              "you should see 46-48GB/s per NIC\"",
              "https://github.com/NVIDIA/nccl-tests/issues/290",
              "ib_ndr", 2),
    Published("Azure NDm A100 v4 (8 x A100 80GB, 8 x 200 Gb/s HDR), 2 nodes", 188.18e9,
              "microsoft/mscclpp docs/performance-ndmv4.md (NCCL 2.17.1, in-place): \"2 "
              "nodes, 8 gpus/node\", NCCL AllReduce BusBW at 4G: 188.18 GB/s",
              "https://github.com/microsoft/mscclpp/blob/main/docs/performance-ndmv4.md",
              "dgx_a100", 16, rails=True, nbytes=4 * 2**30, nccl="defaults (2.17.1)"),
    Published("HGX H100 (8 x H100, 8 x 400 Gb/s NDR), 2 nodes", 392.69e9,
              "NVIDIA/nccl-tests#309, @gj-aion, 2025-06-18: NCCL_ALGO=Ring NCCL_MIN_CTAS=24 "
              "NCCL_IB_QPS_PER_CONNECTION=2, 16 ranks, 8589934592 B: busbw 392.69 (\"sub 400 "
              "GB/s, which is the IB limit of our network\"); NVIDIA/nccl-tests#319, "
              "@AddyLaddy (NVIDIA), 2025-06-11: \"around 48GB/s from each CX7 NIC at 400Gbps "
              "... up to ~396GB/s with the RING protocol\"",
              "https://github.com/NVIDIA/nccl-tests/issues/309",
              "dgx_h100", 16, rails=True, nccl="NCCL_ALGO=Ring, MIN_CTAS=24, QPS=2"),
    Published("Dell XE9680 HGX H100 (8 x H100, 8 x 400 Gb/s NDR), 4 nodes", 365.84e9,
              "NVIDIA/nccl-tests#309, @qoofyk, 2025-05-23 (NCCL 2.26.2, 32 ranks): \"max "
              "busbw can get 365.84 GB/s\" (at 17179869184 B); @kiskra-nvidia (NVIDIA), "
              "2025-06-18: \"That's a good number. ... With 8 400 Gbps NICs your peak would be "
              "at 400 GB/s\"",
              "https://github.com/NVIDIA/nccl-tests/issues/309",
              "dgx_h100", 32, rails=True, nbytes=16 * 2**30, nccl="defaults (2.26.2)"),
    Published("HGX H100 (8 x H100, 8 x 400 Gb/s NDR), 4 nodes", 324.52e9,
              "NVIDIA/nccl-tests#309, @gj-aion, 2025-06-18: all_reduce_perf -b 1M -e 8G on 32 "
              "ranks, 8589934592 B: busbw 324.52 (\"around 325GB/s ... on 4 out of 8 nodes\")",
              "https://github.com/NVIDIA/nccl-tests/issues/309",
              "dgx_h100", 32, rails=True, nccl="defaults", miss=_DEFAULTS_MISS),
    Published("HGX H100 (8 x H100, 8 x 400 Gb/s NDR), 8 nodes", 320.70e9,
              "NVIDIA/nccl-tests#309, @gj-aion, 2025-06-18: \"our 8 node cluster achieves ~320 "
              "GB/s busbw on AllReduce\", 64 ranks, 8589934592 B: busbw 320.70",
              "https://github.com/NVIDIA/nccl-tests/issues/309",
              "dgx_h100", 64, rails=True, nccl="defaults", miss=_DEFAULTS_MISS),
    Published("HGX H100 (8 x H100, 8 x 400 Gb/s NDR), 8 nodes", 391.37e9,
              "NVIDIA/nccl-tests#309, @gj-aion, 2025-06-18: with NCCL_MIN_CTAS=24 and "
              "NCCL_IB_QPS_PER_CONNECTION=2 \"we are getting closer to the 400 GB/s IB limit "
              "on 8 nodes\", 64 ranks, 8589934592 B: busbw 391.37",
              "https://github.com/NVIDIA/nccl-tests/issues/309",
              "dgx_h100", 64, rails=True, nccl="MIN_CTAS=24, QPS=2"),
)


def published_table() -> str:
    """The markdown tables of :data:`PUBLISHED` against ``ringlet predict`` and ``ringlet
    simulate`` (``benchmarks/PUBLISHED.md``): the figures, then each row's commands."""
    rows = ["| # | system | nodes x GPUs | size | NCCL ran with | published busbw | predict | "
            "predict / published | simulate | simulate / published | predict at line rate |",
            "|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    cmds = ["| # | `ringlet predict` | `ringlet simulate` |", "|---:|---|---|"]
    for i, p in enumerate(PUBLISHED, 1):
        model, sim, raw = p.predicted(), p.simulated(), p.predicted(efficiency=False)
        flag = " (miss)" if p.miss else ""
        rows.append(f"| {i} | {p.system}{flag} | {p.shape} | {p.size} | {p.nccl} | "
                    f"{p.busbw / 1e9:.1f} GB/s | {model / 1e9:.1f} GB/s | {model / p.busbw:.3f} | "
                    f"{sim / 1e9:.1f} GB/s | {sim / p.busbw:.3f} | "
                    f"{raw / 1e9:.1f} GB/s ({raw / p.busbw:.2f}x) |")
        cmds.append(f"| {i} | `{p.command()}` | `{p.command('simulate')}` |")
    return "\n".join(rows) + "\n\n" + "\n".join(cmds) + "\n"


if __name__ == "__main__":  # pragma: no cover - `python -m ringlet.cost.topology published`
    import sys

    if sys.argv[1:] == ["published"]:
        sys.stdout.write(published_table())
    else:
        for n in names():
            sys.stdout.write(f"{n}\n")
