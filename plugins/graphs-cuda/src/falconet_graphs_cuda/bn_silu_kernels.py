"""Triton kernels for BatchNorm (training statistics) followed by SiLU, forward and backward,
on a channels-last activation seen as a ``[rows, channels]`` matrix (rows = N x H x W).

Six kernels a layer, as many as PyTorch's pair (cuDNN's BatchNorm, then SiLU apart, forward
and backward: the step's kernel count did not move), but fewer bytes: the forward reads the
input twice and writes the output once; the backward reads the output gradient and the input
twice and writes the input gradient once, recomputing the normalised value and the SiLU's
derivative instead of keeping them: 8 passes over the activation a layer, where PyTorch's
pair moves about 13, and the SiLU's gradient stays in float32 on its way into BatchNorm's.

Every reduction is in float32 and in a fixed order (row blocks of a fixed size, then their
partial results in order), so the kernels give the same bits run to run. The statistics are
combined with the parallel form of Welford's algorithm (count, mean and squared deviations
per block, then merged), not from a sum of squares, which loses the variance of a channel
whose mean is large against its spread.

The kernels' names start with ``bn_silu_``, which the profiler labels (``falconet profile
kernels --by-what``). These are not cuDNN's reductions, so the results agree with PyTorch's
to rounding, not bit for bit; ``tools/bench_bn_silu.py`` measures both on the GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b):
    """Chan et al.'s merge of two (count, mean, squared deviations) summaries."""
    n = n_a + n_b
    delta = mean_b - mean_a
    share = tl.where(n > 0, n_b / tl.maximum(n, 1.0), 0.0)
    mean = mean_a + delta * share
    m2 = m2_a + m2_b + delta * delta * n_a * share
    return n, mean, m2


@triton.jit
def bn_silu_stats(
    x_ptr, mean_ptr, m2_ptr, rows, channels, rows_per_program,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Per program: mean and squared deviations of its rows, per channel of its block."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    begin = pid_r * rows_per_program
    end = tl.minimum(begin + rows_per_program, rows)
    n_a = tl.zeros([BLOCK_C], tl.float32)
    mean_a = tl.zeros([BLOCK_C], tl.float32)
    m2_a = tl.zeros([BLOCK_C], tl.float32)
    for start in range(begin, end, BLOCK_R):
        r = start + tl.arange(0, BLOCK_R)
        row_ok = r < end
        ok = row_ok[:, None] & col_ok[None, :]
        x = tl.load(x_ptr + r[:, None] * channels + cols[None, :], mask=ok, other=0.0)
        x = x.to(tl.float32)
        n_b = tl.sum(row_ok.to(tl.float32), axis=0)
        mean_b = tl.sum(x, axis=0) / n_b
        d = tl.where(ok, x - mean_b[None, :], 0.0)
        n_a, mean_a, m2_a = _merge(n_a, mean_a, m2_a, n_b, mean_b, tl.sum(d * d, axis=0))
    out = pid_r * channels + cols
    tl.store(mean_ptr + out, mean_a, mask=col_ok)
    tl.store(m2_ptr + out, m2_a, mask=col_ok)


@triton.jit
def bn_silu_stats_merge(
    mean_ptr, m2_ptr, batch_mean_ptr, batch_rstd_ptr, running_mean_ptr, running_var_ptr,
    rows, channels, rows_per_program, programs, momentum, eps,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Merge the programs' summaries in order; the batch's mean and 1/std, and the running
    statistics moved towards them (the unbiased variance, as PyTorch keeps)."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    n_a = tl.zeros([BLOCK_C], tl.float32)
    mean_a = tl.zeros([BLOCK_C], tl.float32)
    m2_a = tl.zeros([BLOCK_C], tl.float32)
    for start in range(0, programs, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        p_ok = p < programs
        ok = p_ok[:, None] & col_ok[None, :]
        idx = p[:, None] * channels + cols[None, :]
        means = tl.load(mean_ptr + idx, mask=ok, other=0.0)
        m2s = tl.load(m2_ptr + idx, mask=ok, other=0.0)
        counts = tl.minimum(rows - p * rows_per_program, rows_per_program)
        counts = tl.where(p_ok, counts, 0).to(tl.float32)
        n_b = tl.sum(counts, axis=0)
        mean_b = tl.sum(counts[:, None] * means, axis=0) / n_b
        d = tl.where(ok, means - mean_b[None, :], 0.0)
        m2_b = tl.sum(m2s + counts[:, None] * d * d, axis=0)
        n_a, mean_a, m2_a = _merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b)
    var = m2_a / n_a
    tl.store(batch_mean_ptr + cols, mean_a, mask=col_ok)
    tl.store(batch_rstd_ptr + cols, 1.0 / tl.sqrt(var + eps), mask=col_ok)
    running_mean = tl.load(running_mean_ptr + cols, mask=col_ok)
    running_var = tl.load(running_var_ptr + cols, mask=col_ok)
    unbiased = m2_a / tl.maximum(n_a - 1.0, 1.0)
    running_mean += momentum * (mean_a - running_mean)
    running_var += momentum * (unbiased - running_var)
    tl.store(running_mean_ptr + cols, running_mean, mask=col_ok)
    tl.store(running_var_ptr + cols, running_var, mask=col_ok)


@triton.jit
def bn_silu_normalise(
    x_ptr, z_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, res_ptr, rows, channels, z_row_stride,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """``z = silu((x - mean) * rstd * w + b)`` (plus the residual, if there is one), stored in
    the input's dtype; ``z``'s rows are ``z_row_stride`` apart (a slice of the channels of a
    wider tensor: the parts of a concatenation written in place)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    ok = (r < rows)[:, None] & col_ok[None, :]
    offsets = r[:, None] * channels + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    scale = tl.load(rstd_ptr + cols, mask=col_ok) * tl.load(w_ptr + cols, mask=col_ok)
    shift = tl.load(b_ptr + cols, mask=col_ok) - tl.load(mean_ptr + cols, mask=col_ok) * scale
    y = x * scale[None, :] + shift[None, :]
    z = y * tl.sigmoid(y)
    if HAS_RESIDUAL:
        z += tl.load(res_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    z_offsets = r[:, None] * z_row_stride + cols[None, :]
    tl.store(z_ptr + z_offsets, z.to(z_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _silu_grad(x, dz, mean, rstd, w, b):
    """The normalised input and the gradient reaching the BatchNorm's output."""
    x_hat = (x - mean[None, :]) * rstd[None, :]
    y = x_hat * w[None, :] + b[None, :]
    s = tl.sigmoid(y)
    return x_hat, dz * s * (1.0 + y * (1.0 - s))


@triton.jit
def bn_silu_grad_sums(
    dz_ptr, x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, sum_dy_ptr, sum_dy_xhat_ptr,
    rows, channels, rows_per_program,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Per program: the sums of ``dy`` and ``dy x x_hat`` over its rows, per channel."""
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    mean = tl.load(mean_ptr + cols, mask=col_ok, other=0.0)
    rstd = tl.load(rstd_ptr + cols, mask=col_ok, other=0.0)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
    begin = pid_r * rows_per_program
    end = tl.minimum(begin + rows_per_program, rows)
    sum_dy = tl.zeros([BLOCK_C], tl.float32)
    sum_dy_xhat = tl.zeros([BLOCK_C], tl.float32)
    for start in range(begin, end, BLOCK_R):
        r = start + tl.arange(0, BLOCK_R)
        ok = (r < end)[:, None] & col_ok[None, :]
        offsets = r[:, None] * channels + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
        dz = tl.load(dz_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
        x_hat, dy = _silu_grad(x, dz, mean, rstd, w, b)
        dy = tl.where(ok, dy, 0.0)
        sum_dy += tl.sum(dy, axis=0)
        sum_dy_xhat += tl.sum(dy * x_hat, axis=0)
    out = pid_r * channels + cols
    tl.store(sum_dy_ptr + out, sum_dy, mask=col_ok)
    tl.store(sum_dy_xhat_ptr + out, sum_dy_xhat, mask=col_ok)


@triton.jit
def bn_silu_grad_merge(
    sum_dy_ptr, sum_dy_xhat_ptr, grad_b_ptr, grad_w_ptr, channels, programs,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """The programs' sums added in order: the bias's and the weight's gradients."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    grad_b = tl.zeros([BLOCK_C], tl.float32)
    grad_w = tl.zeros([BLOCK_C], tl.float32)
    for start in range(0, programs, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        ok = (p < programs)[:, None] & col_ok[None, :]
        idx = p[:, None] * channels + cols[None, :]
        grad_b += tl.sum(tl.load(sum_dy_ptr + idx, mask=ok, other=0.0), axis=0)
        grad_w += tl.sum(tl.load(sum_dy_xhat_ptr + idx, mask=ok, other=0.0), axis=0)
    tl.store(grad_b_ptr + cols, grad_b, mask=col_ok)
    tl.store(grad_w_ptr + cols, grad_w, mask=col_ok)


@triton.jit
def bn_silu_input_grad(
    dz_ptr, x_ptr, dx_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, grad_b_ptr, grad_w_ptr,
    rows, channels,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """``dx = w x rstd x (dy - mean(dy) - x_hat x mean(dy x x_hat))``."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    ok = (r < rows)[:, None] & col_ok[None, :]
    offsets = r[:, None] * channels + cols[None, :]
    mean = tl.load(mean_ptr + cols, mask=col_ok, other=0.0)
    rstd = tl.load(rstd_ptr + cols, mask=col_ok, other=0.0)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0)
    x = tl.load(x_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    dz = tl.load(dz_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    x_hat, dy = _silu_grad(x, dz, mean, rstd, w, b)
    inv_rows = 1.0 / rows
    mean_dy = tl.load(grad_b_ptr + cols, mask=col_ok, other=0.0) * inv_rows
    mean_dy_xhat = tl.load(grad_w_ptr + cols, mask=col_ok, other=0.0) * inv_rows
    dx = (w * rstd)[None, :] * (dy - mean_dy[None, :] - x_hat * mean_dy_xhat[None, :])
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=ok)
