import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.autotune(
    configs=[triton.Config({"BLOCK_ROWS": 1}, num_warps=2), triton.Config({"BLOCK_ROWS": 4}, num_warps=4)],
    key=["n_cols"],
)
@triton.jit
def _rms_fwd(x_ptr, w_ptr, y_ptr, rstd_ptr, n_rows, n_cols, eps, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    rstd = libdevice.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps.to(tl.float32))
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + rows[:, None] * n_cols + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_bwd(x_ptr, w_ptr, g_ptr, rstd_ptr, dx_ptr, dwp_ptr, n_cols, BLOCK_COLS: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_COLS)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    gw = g * w
    dx = rstd * gw - x * rstd * rstd * rstd * tl.sum(gw * x, axis=0) / n_cols
    tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dwp_ptr + row * n_cols + cols, g * x * rstd, mask=mask)


class RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        n_rows, n_cols = x2.shape
        y = torch.empty_like(x2)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        block_cols = triton.next_power_of_2(n_cols)
        grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_ROWS"]),)
        _rms_fwd[grid](x2, weight.contiguous(), y, rstd, n_rows, n_cols, eps, BLOCK_COLS=block_cols)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = shape
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, grad_out):
        x2, weight, rstd = ctx.saved_tensors
        g = grad_out.reshape(x2.shape).contiguous()
        n_rows, n_cols = x2.shape
        dx = torch.empty_like(x2)
        dw_partial = torch.empty((n_rows, n_cols), dtype=torch.float32, device=x2.device)
        _rms_bwd[(n_rows,)](x2, weight.contiguous(), g, rstd, dx, dw_partial, n_cols, BLOCK_COLS=triton.next_power_of_2(n_cols))
        return dx.reshape(ctx.shape), dw_partial.sum(0).to(weight.dtype), None


@triton.jit
def _gelu_fwd(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    tl.store(y_ptr + offs, (0.5 * x * (1.0 + libdevice.tanh(inner))).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd(x_ptr, g_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = libdevice.tanh(inner)
    d_inner = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    dx = g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


class GeluTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        xc = x.contiguous()
        y = torch.empty_like(xc)
        n = xc.numel()
        if n:
            _gelu_fwd[(triton.cdiv(n, 128),)](xc, y, n, BLOCK=128)
        ctx.save_for_backward(xc)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (xc,) = ctx.saved_tensors
        g = grad_out.contiguous()
        dx = torch.empty_like(xc)
        n = xc.numel()
        if n:
            _gelu_bwd[(triton.cdiv(n, 128),)](xc, g, dx, n, BLOCK=128)
        return dx


def rms_norm(x, weight, eps=1e-6):
    return RMSNorm.apply(x, weight, eps)


def gelu_tanh(x):
    return GeluTanh.apply(x)
