"""Plots for people who would rather look than read (matplotlib is optional: the `bench` extra)."""
from __future__ import annotations

import numpy as np

from ..errors import PyinferError
from .profile import Profile


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PyinferError("plotting needs matplotlib: pip install 'pyinfer[bench]' (or pip install matplotlib)") from None
    return plt


def plot_power_law(prof: Profile, path: str, target: float = 0.5) -> None:
    """Sorted neuron firing frequencies per layer, and per layer the share of neurons that produce 80%
    of activations."""
    plt = _pyplot()
    thr = prof.thresholds(target)
    freq = np.sort(prof.frequencies(thr), axis=1)[:, ::-1]
    share = prof.share_for_mass(thr)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    cmap = plt.get_cmap("viridis")
    for il in range(len(freq)):
        a.plot(np.arange(1, freq.shape[1] + 1), freq[il], color=cmap(il / max(1, len(freq) - 1)), lw=0.8)
    a.set_xscale("log")
    a.set_xlabel("neuron rank (by firing frequency)")
    a.set_ylabel("firing frequency")
    a.set_title(f"neuron activation, {prof.mode} criterion at {target:.0%} sparsity\n(colour: layer 0 -> last)")
    b.bar(np.arange(len(share)), share * 100)
    b.set_xlabel("layer")
    b.set_ylabel("% of neurons producing 80% of activations")
    b.set_ylim(0, 100)
    b.set_title(f"skew: mean {share.mean():.0%}\n(PowerInfer reports OPT-30B 26%, SwiGLU-70B 75%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
