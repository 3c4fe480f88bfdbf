"""Replay refimpl's GATConv golden vectors with an independent JAX implementation.

For users porting a graph-attention model to JAX: this file writes GATConv from the papers'
equations in ``jax.numpy`` (it imports nothing from refimpl), runs it on the inputs and
parameters of the golden files that ``refimpl golden export DIR`` writes, pulls the stored
cotangent back with ``jax.vjp``, and prints, per case and tensor, the largest relative
error against refimpl's stored output and gradients. No torch is needed.

    refimpl golden export golden/
    python examples/jax_replay.py golden/ [--case NAME ...]

Exit status: 0 when every replayed case agrees within the manifest's tolerances, 1 when a
tensor disagrees (its row says ``FAIL``) or no case could be replayed, 2 when the directory
cannot be read (one line on stderr).

Equations
---------
Symbols as in refimpl: ``N`` nodes, ``E`` edges, ``H`` heads, ``C`` channels per head,
an edge ``u -> v`` from the source ``u`` (``edge_index[0]``) to the target ``v``
(``edge_index[1]``), weights of shape ``(out, in)`` so that ``y = x W^T``. For a target
``v`` with incoming neighbourhood ``N(v)`` and each head ``h`` (GAT-balance Eq. 1-2):

    out_v    = sum_{u in N(v)} alpha_uv W_s x_u                          (Eq. 1)
    alpha_uv = exp(e_uv) / sum_{k in N(v)} exp(e_kv)                     (Eq. 2)

with the score of GATv1 (Velickovic et al. 2018, Eq. 3; ``W_s = W_t = W``) or GATv2
(Brody et al. 2022, Eq. 7):

    v1: e_uv = LeakyReLU(att_src . W x_u + att_dst . W x_v [+ att_edge . W_e a_uv])
    v2: e_uv = att . LeakyReLU(W_s x_u + W_t x_v [+ W_e a_uv])  (W_t = W_s when share_weights)

The brackets are PyG's edge features (``edge_dim``; see "Edge features" below), absent
without them. Shapes: ``x (N, in)``; ``W``, ``W_s``, ``W_t`` ``(H*C, in)``; ``att_src``,
``att_dst``, ``att``, ``att_edge`` ``(H, C)``; ``a (E, D)`` and ``W_e (H*C, D)`` with
``D = edge_dim``, ``W_e a_uv`` read as ``(H, C)``; ``e`` and ``alpha`` ``(E, H)``. With
``projection_bias`` (v2; PyG's ``GATv2Conv(bias=True)``) ``W_s x_u`` and ``W_t x_v`` become
``W_s x_u + b_s`` and ``W_t x_v + b_t`` (``b_s``, ``b_t`` ``(H*C,)``; ``b_t = b_s`` when
shared), in the score and in the message (the message never includes ``W_e a_uv``). Heads
are concatenated to ``(N, H*C)`` or averaged to ``(N, C)`` (Velickovic et al. Eq. 5-6);
then ``x W_res^T`` is added (``residual``, no bias of its own) and the ``bias``. Every
option of refimpl's GATConv is implemented; a case with an option this file does not know
(or a combination refimpl's layer refuses) is reported as ``skipped: <reason>``.

Conventions the golden files follow (refimpl.nn.gat.conv's docstring):

* ``add_self_loops``: existing self-loops are removed and one per node appended, so the
  attended edges are "non-loop edges in file order, then the loops of nodes 0..N-1".
  Duplicate edges each get their own coefficient; a node with no incoming edge outputs the
  bias alone.
* LeakyReLU's derivative at exactly 0 is the negative slope.
* Edge features ``a`` (E, D) come one row per edge of the graph as given (``edge_index``
  order; the manifest's ``forward.array_kwargs["edge_attr"]`` names the array, and its
  gradient is stored under ``grad/`` + that name). Without ``add_self_loops`` they are used
  as given. With it, a dropped self-loop's row goes with it, and the loop appended for node
  ``v`` gets ``fill[v]`` (D,), computed from the rows ``a_e`` of the remaining edges into
  ``v`` (PyG's ``add_self_loops(..., fill_value)``):

      fill_value          fill[v]                                  no edge into v
      a number c          c in every feature                       c
      D numbers           those numbers                            those numbers
      None                ones                                     ones
      "add", "sum"        sum_{e -> v} a_e                         0
      "mean"              sum_{e -> v} a_e / |N(v)|                0
      "max", "min"        featurewise max / min over e -> v        0
      "mul"               featurewise product over e -> v          1

  ``jax.vjp`` carries the gradient of ``fill`` back into the rows it read. Where several
  edges attain a max / min, they share its gradient equally (refimpl's and torch's
  ``scatter_reduce`` convention): :func:`segment_extreme` writes the extreme as
  ``m + sum_e share_e (a_e - stop_gradient(a_e))``, whose value is ``m`` and whose
  derivative is ``share_e = [a_e = m] / #ties``, whatever ``jax.ops.segment_max``'s own
  derivative does at ties (not relied on here). The product is ``jnp.prod`` over a table
  padded with ones, whose derivative is the product of the other factors, exact with zeros
  among them.
* Attention dropout in training: ``alpha * keep / (1 - p)`` with the stored keep-mask
  ``noise/attn_dropout_mask`` (E, H), True = keep.
* LipschitzNorm (per head ``h``, per target ``v``; never with edge features, which refimpl's
  layer refuses), dividing the score (LipschitzNorm Eq. 17, taken neighbour-wise): v1
  divides ``pre = att_src . W x_u + att_dst . W x_v`` before the LeakyReLU, v2 the whole
  score; ``||a_h||`` is the norm of the head's attention vectors (v1
  ``[att_src_h ; att_dst_h]``):

      paper, v1:          D = ||a_h|| sqrt(max_{k in N(v)} ||W x_k||^2 + ||W x_v||^2)
      paper, v2:          D = ||a_h|| max_{k in N(v)} ||W_s x_k + W_t x_v||
      reference-code, v1: D = 4 ||a_h|| sqrt(max_{k in N(v)} ||W x_k||^2 + ||W x_u||^2) + 1e-12

  (the authors' released code, per head). A zero ``D`` is replaced by 1; the golden inputs
  are random, so no tie or zero norm reaches a point where JAX's derivative conventions
  could differ from refimpl's.

The softmax subtracts each neighbourhood's maximum under ``stop_gradient``: it cancels in the
quotient, so it changes no value and no derivative, only keeps ``exp`` in range.

Tolerances are the manifest's (``output_rtol`` for the output, ``gradient_rtol`` for every
gradient), on ``max |ours - stored| / max |stored|`` per tensor. The files' SHA-256 are not
checked here; ``refimpl golden verify DIR`` checks them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ModuleNotFoundError as err:  # one line, not a traceback, for a missing optional extra
    print(f"jax_replay.py needs JAX ({err}): pip install jax", file=sys.stderr)
    raise SystemExit(2) from None

jax.config.update("jax_enable_x64", True)  # the golden files are float64

DEFAULT_TOLERANCES = {"output_rtol": 1e-12, "gradient_rtol": 1e-10}
# GATConv's options (the manifest's "config") implemented here, with refimpl's defaults; the
# channel counts have none. A case with any other option is skipped.
_DEFAULTS = {
    "heads": 1,
    "concat": True,
    "version": "v1",
    "share_weights": False,
    "negative_slope": 0.2,
    "add_self_loops": True,
    "bias": True,
    "dropout": 0.0,
    "lipschitz_norm": None,
    "residual": False,
    "projection_bias": False,
    "edge_dim": None,  # D, the width of the edge features a (E, D), or None
    "fill_value": "mean",  # the added loops' edge features: read only with edge_dim
}
FILL_REDUCTIONS = ("mean", "add", "sum", "max", "min", "mul")
_REQUIRED = ("in_channels", "out_channels")
_LIPSCHITZ = {"paper": (1.0, 0.0), "reference-code": (4.0, 1e-12)}  # (factor, eps) of D


class UnreadableDirectory(Exception):
    """A golden directory this script cannot read: exit status 2, one line."""


# -- the layer ----------------------------------------------------------------------------------
def attended_edges(
    edge_index: np.ndarray, num_nodes: int, add_self_loops: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` (E,) of the edges attended: self-loops replaced by one per node if set."""
    src, dst = edge_index
    if add_self_loops:
        keep = src != dst
        loops = np.arange(num_nodes)
        src, dst = np.concatenate([src[keep], loops]), np.concatenate([dst[keep], loops])
    return src, dst


def loop_features(
    edge_attr: jax.Array, edge_index: np.ndarray, num_nodes: int, fill_value: object
) -> jax.Array:
    """Edge features ``(E, D)`` over ``edge_index`` -> ``(E' + N, D)`` over the edges
    :func:`attended_edges` returns with ``add_self_loops``: the non-loop edges' rows, then
    ``fill[v]`` for the loops of nodes ``0..N-1`` (the table of the module docstring)."""
    src, dst = edge_index
    keep = src != dst
    features, targets = edge_attr[keep], dst[keep]  # (E', D), (E',)
    width = edge_attr.shape[1]
    count = np.bincount(targets, minlength=num_nodes)[:, None]  # (N, 1) |N(v)|
    if fill_value is None or not isinstance(fill_value, str):  # a constant: no gradient
        constant = 1.0 if fill_value is None else jnp.asarray(fill_value, edge_attr.dtype)
        fill = jnp.broadcast_to(constant, (num_nodes, width)).astype(edge_attr.dtype)
    elif fill_value in ("add", "sum", "mean"):
        fill = jax.ops.segment_sum(features, targets, num_segments=num_nodes)
        if fill_value == "mean":
            fill = fill / np.maximum(count, 1)
    elif fill_value in ("max", "min"):
        fill = segment_extreme(features, targets, num_nodes, fill_value)
        fill = jnp.where(count > 0, fill, 0.0)
    else:  # "mul": (N, max |N(v)|, D) of each node's factors, padded with ones
        order = np.argsort(targets, kind="stable")
        starts = np.concatenate([[0], np.cumsum(count[:, 0])[:-1]])
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size) - starts[targets[order]]  # slot within its target
        table = jnp.ones((num_nodes, max(int(count.max(initial=0)), 1), width), edge_attr.dtype)
        fill = table.at[targets, rank].set(features).prod(axis=1)
    return jnp.concatenate([features, fill], axis=0)


def segment_extreme(
    values: jax.Array, segments: np.ndarray, num_segments: int, which: str
) -> jax.Array:
    """Featurewise max or min (``which``) of ``values`` (E', D) per segment, ``(S, D)``;
    the edges that attain it share its gradient equally. Empty segments: +-inf."""
    fixed = jax.lax.stop_gradient(values)
    reduce = jax.ops.segment_max if which == "max" else jax.ops.segment_min
    extreme = reduce(fixed, segments, num_segments=num_segments)  # (S, D) the value m
    attains = (fixed == extreme[segments]).astype(values.dtype)  # (E', D) [a_e = m]
    ties = jax.ops.segment_sum(attains, segments, num_segments=num_segments)
    share = attains / jnp.maximum(ties, 1.0)[segments]  # (E', D) the gradient's share
    # m + sum_e share_e (a_e - a_e): the value is m exactly, the derivative share_e
    return extreme + jax.ops.segment_sum(
        share * (values - fixed), segments, num_segments=num_segments
    )


def leaky_relu(p: jax.Array, slope: float) -> jax.Array:
    """LeakyReLU whose derivative at 0 is ``slope`` (``>``, not ``>=``; PyTorch's convention)."""
    return jnp.where(p > 0, p, slope * p)


def lipschitz_denominator(
    config: dict,
    params: dict,
    h: jax.Array,
    pre: jax.Array | None,
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
) -> jax.Array:
    """``D`` (E, H) of LipschitzNorm (module docstring): ``h = W x`` (N, H, C) for v1,
    ``pre = W_s x_u + W_t x_v`` (E, H, C) for v2."""
    factor, eps = _LIPSCHITZ[config["lipschitz_norm"]]
    names = ("att_src", "att_dst") if config["version"] == "v1" else ("att",)
    att_norm = jnp.sqrt(sum((params[name] ** 2).sum(axis=1) for name in names))  # (H,)
    if config["version"] == "v1":
        norms = (h**2).sum(axis=2)  # (N, H) ||W x_k||^2
        neighbour_max = jax.ops.segment_max(norms[src], dst, num_segments=num_nodes)  # (N, H)
        own = norms[src] if config["lipschitz_norm"] == "reference-code" else norms[dst]
        radius = jnp.sqrt(neighbour_max[dst] + own)  # (E, H)
    else:
        norms = jnp.sqrt((pre**2).sum(axis=2))  # (E, H) ||x_uv||
        radius = jax.ops.segment_max(norms, dst, num_segments=num_nodes)[dst]  # (E, H)
    denominator = factor * att_norm * radius + eps
    return jnp.where(denominator > 0, denominator, 1.0)


def gat_conv(
    config: dict,
    params: dict,
    x: jax.Array,
    src: np.ndarray,
    dst: np.ndarray,
    keep: np.ndarray | None,
    edge_attr: jax.Array | None = None,
) -> jax.Array:
    """GATConv's output, ``(N, H*C)`` if ``concat`` else ``(N, C)`` (module docstring).

    ``src``, ``dst`` are the attended edges (:func:`attended_edges`); ``keep`` (E, H) the
    attention-dropout keep-mask, or None outside training; ``edge_attr`` (E, D) the edge
    features over the attended edges (the loops' rows filled: :func:`loop_features`), with
    ``edge_dim`` only.
    """
    num_nodes, heads, channels = x.shape[0], config["heads"], config["out_channels"]
    slope = config["negative_slope"]
    v1 = config["version"] == "v1"
    shared = v1 or config["share_weights"]
    if v1:
        h_s = x @ params["W"].T  # (N, H*C)
    else:
        h_s = x @ params["W_s"].T + params.get("b_s", 0.0)
    h_t = h_s if shared else x @ params["W_t"].T + params.get("b_t", 0.0)
    h_s = h_s.reshape(num_nodes, heads, channels)  # (N, H, C)
    h_t = h_t.reshape(num_nodes, heads, channels)
    h_edge = 0.0  # W_e a_uv (E, H, C) with edge features
    if edge_attr is not None:
        h_edge = (edge_attr @ params["W_e"].T).reshape(len(src), heads, channels)
    # the score e (E, H)
    pre = None
    if v1:
        score = (h_s[src] * params["att_src"]).sum(-1) + (h_t[dst] * params["att_dst"]).sum(-1)
        if edge_attr is not None:
            score = score + (h_edge * params["att_edge"]).sum(-1)
    else:
        pre = h_s[src] + h_t[dst] + h_edge  # (E, H, C)
        score = (leaky_relu(pre, slope) * params["att"]).sum(-1)
    if config["lipschitz_norm"] is not None:
        score = score / lipschitz_denominator(config, params, h_s, pre, src, dst, num_nodes)
    if v1:
        score = leaky_relu(score, slope)  # after LipschitzNorm, as the released code
    # softmax over each target's incoming edges (E, H)
    shift = jax.lax.stop_gradient(jax.ops.segment_max(score, dst, num_segments=num_nodes))
    weight = jnp.exp(score - shift[dst])
    alpha = weight / jax.ops.segment_sum(weight, dst, num_segments=num_nodes)[dst]
    if keep is not None:
        alpha = alpha * keep / (1.0 - config["dropout"])
    # aggregate W_s x_u into each target (N, H, C), then the heads
    aggregated = jax.ops.segment_sum(alpha[..., None] * h_s[src], dst, num_segments=num_nodes)
    if config["concat"]:
        out = aggregated.reshape(num_nodes, heads * channels)  # (N, H*C)
    else:
        out = aggregated.mean(axis=1)  # (N, C)
    if config["residual"]:
        out = out + x @ params["W_res"].T
    if config["bias"]:
        out = out + params["bias"]
    return out


# -- one case -----------------------------------------------------------------------------------
def configuration(entry: dict) -> tuple[dict, str]:
    """The case's GATConv options with defaults filled in, and why this script cannot replay
    it ("" when it can)."""
    given = entry["config"]
    config = {**_DEFAULTS, **given}
    unknown = sorted(set(given) - set(_DEFAULTS) - set(_REQUIRED))
    if unknown:
        return config, "options not implemented here: " + ", ".join(
            f"{key}={given[key]!r}" for key in unknown
        )
    missing = [key for key in _REQUIRED if key not in given]
    if missing:
        return config, "the config lacks " + ", ".join(missing)
    if config["version"] not in ("v1", "v2"):
        return config, f"version={config['version']!r}"
    if config["edge_dim"] is not None:
        reason = edge_features_problem(entry, config)
        if reason:
            return config, reason
    if config["projection_bias"] and config["version"] != "v2":
        return config, "projection_bias is defined for v2 only"
    if config["lipschitz_norm"] not in (None, *_LIPSCHITZ):
        return config, f"lipschitz_norm={config['lipschitz_norm']!r}"
    if config["lipschitz_norm"] == "reference-code" and config["version"] != "v1":
        return config, "lipschitz_norm='reference-code' is defined for v1 only"
    if dropout_active(entry, config) and "attn_dropout_mask" not in entry["forward"].get(
        "array_kwargs", {}
    ):
        return config, "attention dropout in training without a stored keep-mask"
    return config, ""


def edge_features_problem(entry: dict, config: dict) -> str:
    """Why a case with ``edge_dim`` cannot be replayed ("" when it can)."""
    edge_dim, fill_value = config["edge_dim"], config["fill_value"]
    if isinstance(edge_dim, bool) or not isinstance(edge_dim, int) or edge_dim < 1:
        return f"edge_dim={edge_dim!r}"
    if "edge_attr" not in entry["forward"].get("array_kwargs", {}):
        return "edge_dim without an edge_attr array in the forward's array_kwargs"
    if config["lipschitz_norm"] is not None:
        return "lipschitz_norm with edge_dim (refimpl's layer refuses the combination)"
    constant = isinstance(fill_value, (int, float)) and not isinstance(fill_value, bool)
    numbers = isinstance(fill_value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in fill_value
    )
    if not (fill_value is None or fill_value in FILL_REDUCTIONS or constant or numbers):
        return f"fill_value={fill_value!r}"
    if numbers and len(fill_value) != edge_dim:
        return f"fill_value has {len(fill_value)} numbers for edge_dim={edge_dim}"
    return ""


def edge_attr_key(entry: dict, config: dict) -> str | None:
    """The name of the edge-feature array in the case's file, None without ``edge_dim``."""
    if config["edge_dim"] is None:
        return None
    return entry["forward"]["array_kwargs"]["edge_attr"]


def dropout_active(entry: dict, config: dict) -> bool:
    return bool(entry["forward"].get("kwargs", {}).get("training")) and config["dropout"] > 0


def param_names(config: dict) -> list[str]:
    """The parameters the layer reads (module docstring), as the files name them."""
    if config["version"] == "v1":
        names = ["W", "att_src", "att_dst"]
    else:
        names = ["W_s", "b_s"] if config["projection_bias"] else ["W_s"]
        if not config["share_weights"]:
            names += ["W_t", "b_t"] if config["projection_bias"] else ["W_t"]
        names.append("att")
    if config["edge_dim"] is not None:
        names += ["W_e", "att_edge"] if config["version"] == "v1" else ["W_e"]
    names += ["W_res"] * config["residual"] + ["bias"] * config["bias"]
    return names


def relative_error(ours: np.ndarray, stored: np.ndarray) -> float:
    """``max |ours - stored| / max |stored|``: 0 where both are zero, inf on a shape mismatch."""
    if ours.shape != stored.shape:
        return float("inf")
    error = float(np.max(np.abs(ours - stored), initial=0.0))
    scale = float(np.max(np.abs(stored), initial=0.0))
    if error == 0.0:
        return 0.0
    return error / scale if scale > 0 else float("inf")


def replay_case(
    entry: dict, config: dict, arrays: dict[str, np.ndarray], tolerances: dict[str, float]
) -> list[tuple[str, float, float]]:
    """``(tensor, max relative error, rtol)`` for the output and every stored gradient."""
    edge_index, num_nodes = arrays["input/edge_index"], int(arrays["input/num_nodes"])
    src, dst = attended_edges(edge_index, num_nodes, config["add_self_loops"])
    keep = None
    if dropout_active(entry, config):
        keep = arrays[entry["forward"]["array_kwargs"]["attn_dropout_mask"]]  # (E, H) bool
    params = {name: jnp.asarray(arrays[f"param/{name}"]) for name in param_names(config)}
    edge_key = edge_attr_key(entry, config)
    # (E, D) over the given edges; (E,) for edge_dim=1 is read as (E, 1), as PyG does; a
    # case without edge features passes an empty array that the layer does not read
    edge_attr = jnp.asarray(arrays[edge_key]) if edge_key else jnp.zeros(0)

    def layer(x: jax.Array, edge_attr: jax.Array, params: dict) -> jax.Array:
        attended = None
        if edge_key:
            attended = edge_attr.reshape(edge_index.shape[1], -1)
            if config["add_self_loops"]:
                attended = loop_features(attended, edge_index, num_nodes, config["fill_value"])
        return gat_conv(config, params, x, src, dst, keep, attended)

    # one compiled program for the forward and the pullback (eagerly, XLA compiles every
    # small operation on its own, which costs more than the case computes)
    @jax.jit
    def output_and_pullback(
        x: jax.Array, edge_attr: jax.Array, params: dict, cotangent: jax.Array
    ) -> tuple:
        out, pullback = jax.vjp(layer, x, edge_attr, params)
        return out, pullback(cotangent)

    x, cotangent = jnp.asarray(arrays["input/x"]), jnp.asarray(arrays["cotangent"])
    out, (d_x, d_edge_attr, d_params) = output_and_pullback(x, edge_attr, params, cotangent)
    ours = {"output/out": out, "grad/input/x": d_x}
    if edge_key:
        ours[f"grad/{edge_key}"] = d_edge_attr
    ours |= {f"grad/param/{name}": value for name, value in d_params.items()}
    rows = [("output/out", tolerances["output_rtol"])]
    rows += [(key, tolerances["gradient_rtol"]) for key in arrays if key.startswith("grad/")]
    return [
        (
            key,
            relative_error(np.asarray(ours[key]), arrays[key]) if key in ours else float("inf"),
            rtol,
        )
        for key, rtol in rows
    ]


# -- the directory ------------------------------------------------------------------------------
def read_manifest(directory: Path) -> dict:
    path = directory / "manifest.json"
    if not path.is_file():
        raise UnreadableDirectory(
            f"no manifest.json in {directory}: export one with `refimpl golden export DIR`"
        )
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UnreadableDirectory(f"{path} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "refimpl-golden":
        raise UnreadableDirectory(f"{path} is not a refimpl golden manifest")
    return manifest


def well_formed(entry: object) -> bool:
    """A manifest entry with the fields read here, of the types export writes."""
    return (
        isinstance(entry, dict)
        and all(isinstance(entry.get(key), str) for key in ("name", "file", "class"))
        and isinstance(entry.get("config"), dict)
        and isinstance(entry.get("forward"), dict)
    )


def load_arrays(directory: Path, entry: dict, config: dict) -> dict[str, np.ndarray]:
    path = directory / entry["file"]
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as err:  # missing, truncated or not a zip: say which file
        raise UnreadableDirectory(f"cannot read {path} (case {entry['name']}): {err}") from None
    needed = ["input/x", "input/edge_index", "input/num_nodes", "cotangent", "output/out"]
    needed += [f"param/{name}" for name in param_names(config)]
    needed += [key for key in [edge_attr_key(entry, config)] if key]
    if dropout_active(entry, config):
        needed.append(entry["forward"]["array_kwargs"]["attn_dropout_mask"])
    missing = [key for key in needed if key not in arrays]
    if missing:
        raise UnreadableDirectory(f"{path} lacks {', '.join(missing)} (case {entry['name']})")
    return arrays


def replay(directory: Path, names: list[str] | None) -> int:
    """Print the table for the GATConv cases of ``directory`` (or those named); exit status."""
    manifest = read_manifest(directory)
    tolerances = {**DEFAULT_TOLERANCES, **manifest.get("tolerances", {})}
    entries = manifest.get("cases")
    if not isinstance(entries, list) or not all(map(well_formed, entries)):
        raise UnreadableDirectory(
            f"{directory / 'manifest.json'}: 'cases' must list objects with a name, file, "
            "class, config and forward"
        )
    cases = [entry for entry in entries if entry["class"] == "GATConv"]
    available = [entry["name"] for entry in cases]
    if not cases:
        raise UnreadableDirectory(f"{directory / 'manifest.json'} lists no GATConv case")
    unknown = [name for name in names or [] if name not in available]
    if unknown:
        raise UnreadableDirectory(
            f"no GATConv case {', '.join(unknown)}; the GATConv cases are {', '.join(available)}"
        )
    chosen = [entry for entry in cases if names is None or entry["name"] in names]
    width = max(len(name) for name in available)
    print(f"{'case':<{width}}  {'tensor':<22} {'max rel err':>12} {'rtol':>8}  result")
    replayed = failed = 0
    for entry in chosen:
        config, reason = configuration(entry)
        if reason:
            print(f"{entry['name']:<{width}}  skipped: {reason}")
            continue
        replayed += 1
        arrays = load_arrays(directory, entry, config)
        for tensor, error, rtol in replay_case(entry, config, arrays, tolerances):
            passed = error <= rtol
            failed += not passed
            print(
                f"{entry['name']:<{width}}  {tensor:<22} {error:>12.3e} {rtol:>8.0e}  "
                f"{'pass' if passed else 'FAIL'}"
            )
    skipped = len(chosen) - replayed
    if not replayed:
        print(f"FAIL: no case replayed ({skipped} skipped)")
        return 1
    verdict = "PASS:" if not failed else f"FAIL: {failed} tensor(s) disagree;"
    print(f"{verdict} {replayed} case(s) replayed with jax {jax.__version__}, {skipped} skipped")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Replay refimpl's GATConv golden vectors with an independent JAX layer."
    )
    parser.add_argument("directory", type=Path, help="a directory from `refimpl golden export`")
    parser.add_argument(
        "--case",
        action="extend",
        nargs="+",
        dest="cases",
        metavar="NAME",
        help="replay only these cases (default: every GATConv case)",
    )
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        print(f"jax_replay.py: {args.directory} is not a directory", file=sys.stderr)
        return 2
    try:
        return replay(args.directory, args.cases)
    except UnreadableDirectory as err:
        print(f"jax_replay.py: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
