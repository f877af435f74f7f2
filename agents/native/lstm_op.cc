// Fused LSTM sequence kernels (forward and backward) as TensorFlow CPU ops.
//
// The TF-graph kernels of agents/fastrnn.py run ~13 small ops per LSTM step; at the learner's
// shapes ([32, 128] x [128, 512]) TF's per-op cost is as large as the work. These ops run the whole
// recurrence of a sequence inside one kernel: per step one GEMM (Eigen, single-threaded; the
// learner's target and online unrolls run as separate ops on TF's inter-op threads) and vectorised
// elementwise loops. Keras LSTMCell layout: gates i, f, c (here g), o.
//
//   forward, per step:  hm = keep_t h;  cm = keep_t c;  z = x_t + hm U;
//                       i, f, o = sigmoid(z_i, z_f, z_o);  g = tanh(z_g);
//                       c = f cm + i g;  h = o tanh(c)
//   backward, per step: dz from dh, dc and the saved gates;  dh' = keep_t dz U^T;  dc' = keep_t f dc
//   over blocks of finished steps, while the sequential loop goes on, a helper thread computes
//   [dU; dW; dbias] += [hm | xin | 1]_blk^T dz_blk (one GEMM) and dxin_blk = dz_blk W^T (the input
//   projection x = xin W + bias is a TF matmul in the forward; its gradient lives here, so no large
//   matmul waits for the loop to end); the loop's thread takes blocks too once it is done. Each
//   block's terms are added in block order, so the sums do not depend on which thread took which.
//
// Tensors TF sees (x, keep, hs, dhs, xin, dxin) are batch-major [B, T, ...] like the network's
// layers, so no transposes surround the ops; what only the backward op reads (cs, act, hm, cm) is
// time-major, contiguous per step.
//
// Built on first use by agents/native/__init__.py (g++ against the installed TF's headers).

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common.h"

using namespace recurrl;  // NOLINT: the shared TF names and Eigen maps

namespace {

using Col = Eigen::Array<float, Eigen::Dynamic, 1>;
using RowMap = Eigen::Map<Eigen::RowVectorXf>;
// Step t of a batch-major [B, T, D] tensor: B rows of D, T * D apart.
using Stride = Eigen::OuterStride<>;
using StepMap = Eigen::Map<Arr, 0, Stride>;
using ConstStepMap = Eigen::Map<const Arr, 0, Stride>;
using ConstKeepMap = Eigen::Map<const Col, 0, Eigen::InnerStride<>>;

// Steps per block of the backward op's gradient GEMMs, e.g. [U, kBlock * B] x [kBlock * B, 4U].
constexpr int64_t kBlock = 8;

// sigmoid(a) = (1 + tanh(a / 2)) / 2: Eigen's vectorised float tanh serves both activations.
template <typename Expr>
auto Sigmoid(const Expr& a) {
  return (a * 0.5f).tanh() * 0.5f + 0.5f;
}

}  // namespace

REGISTER_OP("RecurrlLstmForward")
    .Input("x: float")       // [B, T, 4U] projected inputs, bias included
    .Input("keep: float")    // [B, T] 0 where the state is zeroed before the step
    .Input("h0: float")      // [B, U]
    .Input("c0: float")      // [B, U]
    .Input("rk: float")      // [U, 4U] recurrent kernel
    .Output("hs: float")     // [B, T, U] h after each step
    .Output("h_last: float")  // [B, U] h after the last step
    .Output("c_last: float")  // [B, U] c after the last step
    .Output("cs: float")     // [T, B, U] c after each step (for the backward op, as are the next)
    .Output("act: float")    // [T, B, 4U] gate activations i, f, g, o
    .Output("hm: float")     // [T, B, U] keep_t h_{t-1}: the state each step's matmul saw
    .Output("cm: float")     // [T, B, U] keep_t c_{t-1}
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle x, h0;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &h0));
      auto b = c->Dim(x, 0), t = c->Dim(x, 1), u = c->Dim(h0, 1);
      auto tbu = c->MakeShape({t, b, u});
      c->set_output(0, c->MakeShape({b, t, u}));
      c->set_output(1, c->MakeShape({b, u}));
      c->set_output(2, c->MakeShape({b, u}));
      c->set_output(3, tbu);
      c->set_output(4, c->MakeShape({t, b, c->Dim(x, 2)}));
      c->set_output(5, tbu);
      c->set_output(6, tbu);
      return absl::OkStatus();
    });

REGISTER_OP("RecurrlLstmBackward")
    .Input("dhs: float")      // [B, T, U] gradient of hs
    .Input("dh_last: float")  // [B, U] gradient of h_last
    .Input("dc_last: float")  // [B, U] gradient of c_last
    .Input("keep: float")     // [B, T]
    .Input("rk: float")       // [U, 4U]
    .Input("cs: float")       // forward outputs
    .Input("act: float")
    .Input("cm: float")
    .Input("hm: float")
    .Input("xin: float")      // [B, T, F] inputs of the projection x = xin wx + bias
    .Input("wx: float")       // [F, 4U] input kernel
    .Output("dxin: float")    // [B, T, F]
    .Output("dh0: float")     // [B, U]
    .Output("dc0: float")     // [B, U]
    .Output("drk: float")     // [U, 4U] gradient of the recurrent kernel
    .Output("dwx: float")     // [F, 4U] gradient of the input kernel
    .Output("dbias: float")   // [4U]
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(9));
      c->set_output(1, c->input(1));
      c->set_output(2, c->input(2));
      c->set_output(3, c->input(4));
      c->set_output(4, c->input(10));
      c->set_output(5, c->Vector(c->Dim(c->input(10), 1)));
      return absl::OkStatus();
    });

class LstmForwardOp : public OpKernel {
 public:
  explicit LstmForwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& keep = ctx->input(1);
    const Tensor& h0 = ctx->input(2);
    const Tensor& c0 = ctx->input(3);
    const Tensor& rk = ctx->input(4);
    OP_REQUIRES(ctx, x.dims() == 3 && rk.dims() == 2 && h0.dims() == 2,
                InvalidArgument("x must be [B, T, 4U], h0 [B, U], rk [U, 4U]"));
    const int64_t B = x.dim_size(0), T = x.dim_size(1), U = rk.dim_size(0), G = 4 * U;
    OP_REQUIRES(ctx, x.dim_size(2) == G && rk.dim_size(1) == G,
                InvalidArgument("x's last dim and rk's columns must be 4 * units"));
    OP_REQUIRES(ctx, h0.dim_size(0) == B && h0.dim_size(1) == U && c0.shape() == h0.shape(),
                InvalidArgument("h0 and c0 must be [B, U]"));
    OP_REQUIRES(ctx, keep.shape() == TensorShape({B, T}), InvalidArgument("keep must be [B, T]"));

    Tensor *hs_t, *hl_t, *cl_t, *cs_t, *act_t, *hm_t, *cm_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({B, T, U}), &hs_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, h0.shape(), &hl_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, h0.shape(), &cl_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({T, B, U}), &cs_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({T, B, G}), &act_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({T, B, U}), &hm_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(6, TensorShape({T, B, U}), &cm_t));
    ArrMap h(hl_t->flat<float>().data(), B, U);  // the running state; its final value is h_last
    ArrMap c_last(cl_t->flat<float>().data(), B, U);
    h = ConstArrMap(h0.flat<float>().data(), B, U);
    c_last = ConstArrMap(c0.flat<float>().data(), B, U);
    if (T == 0 || B == 0 || U == 0) return;

    const float* xp = x.flat<float>().data();
    const float* kp = keep.flat<float>().data();
    float* hsp = hs_t->flat<float>().data();
    float* csp = cs_t->flat<float>().data();
    float* actp = act_t->flat<float>().data();
    float* hmp = hm_t->flat<float>().data();
    float* cmp = cm_t->flat<float>().data();
    ConstMatMap rkm(rk.flat<float>().data(), U, G);
    for (int64_t t = 0; t < T; ++t) {
      const float* cprev = t ? csp + (t - 1) * B * U : c0.flat<float>().data();
      ConstKeepMap k(kp + t, B, Eigen::InnerStride<>(T));
      MatMap hm(hmp + t * B * U, B, U);
      ArrMap cm(cmp + t * B * U, B, U);
      hm.array() = h.colwise() * k;
      cm = ConstArrMap(cprev, B, U).colwise() * k;
      MatMap z(actp + t * B * G, B, G);
      z = ConstStepMap(xp + t * G, B, G, Stride(T * G)).matrix();
      z.noalias() += hm * rkm;
      ArrMap za(z.data(), B, G);
      za.leftCols(2 * U) = Sigmoid(za.leftCols(2 * U));
      za.middleCols(2 * U, U) = za.middleCols(2 * U, U).tanh();
      za.rightCols(U) = Sigmoid(za.rightCols(U));
      ArrMap c(csp + t * B * U, B, U);
      c = za.middleCols(U, U) * cm + za.leftCols(U) * za.middleCols(2 * U, U);
      h = za.rightCols(U) * c.tanh();
      StepMap(hsp + t * U, B, U, Stride(T * U)) = h;
    }
    c_last = ConstArrMap(csp + (T - 1) * B * U, B, U);
  }
};

class LstmBackwardOp : public OpKernel {
 public:
  explicit LstmBackwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dhs = ctx->input(0);
    const Tensor& dh_last = ctx->input(1);
    const Tensor& dc_last = ctx->input(2);
    const Tensor& keep = ctx->input(3);
    const Tensor& rk = ctx->input(4);
    const Tensor& cs = ctx->input(5);
    const Tensor& act = ctx->input(6);
    const Tensor& cm_in = ctx->input(7);
    const Tensor& hm_in = ctx->input(8);
    const Tensor& xin = ctx->input(9);
    const Tensor& wx = ctx->input(10);
    // Every shape the loops below rely on, checked before anything is allocated or written.
    OP_REQUIRES(ctx, act.dims() == 3 && rk.dims() == 2 && xin.dims() == 3 && wx.dims() == 2,
                InvalidArgument("LSTM backward: act and xin must be 3-D, rk and wx 2-D"));
    const int64_t T = act.dim_size(0), B = act.dim_size(1), U = rk.dim_size(0), G = 4 * U;
    const int64_t F = xin.dim_size(2);
    OP_REQUIRES(ctx, rk.dim_size(1) == G,
                InvalidArgument("LSTM backward: rk must be [U, 4U], got ", rk.shape().DebugString()));
    const TensorShape tbu({T, B, U});
    OP_REQUIRES(ctx, act.dim_size(2) == G && dhs.shape() == TensorShape({B, T, U}) && cs.shape() == tbu &&
                         cm_in.shape() == tbu && hm_in.shape() == tbu && dh_last.shape() == TensorShape({B, U}) &&
                         dc_last.shape() == dh_last.shape() && keep.shape() == TensorShape({B, T}) &&
                         xin.shape() == TensorShape({B, T, F}) && wx.shape() == TensorShape({F, G}),
                InvalidArgument("LSTM backward: inconsistent shapes"));

    Tensor *dxin_t, *dh0_t, *dc0_t, *drk_t, *dwx_t, *db_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, xin.shape(), &dxin_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, dh_last.shape(), &dh0_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, dc_last.shape(), &dc0_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, rk.shape(), &drk_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, wx.shape(), &dwx_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({G}), &db_t));
    Tensor dz_t;  // [T, B, 4U] gradient of the pre-activations (= of the projection's output)
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_FLOAT, act.shape(), &dz_t));
    float* dxinp = dxin_t->flat<float>().data();
    const float* xinp = xin.flat<float>().data();
    const float* hmp = hm_in.flat<float>().data();
    float* dzp = dz_t.flat<float>().data();
    MatMap drk(drk_t->flat<float>().data(), U, G), dwx(dwx_t->flat<float>().data(), F, G);
    RowMap db(db_t->flat<float>().data(), G);
    drk.setZero();
    dwx.setZero();
    db.setZero();
    float* dhp = dh0_t->flat<float>().data();  // the running gradients; final values dh0, dc0
    float* dcp = dc0_t->flat<float>().data();
    std::copy_n(dh_last.flat<float>().data(), B * U, dhp);
    std::copy_n(dc_last.flat<float>().data(), B * U, dcp);
    std::fill_n(dxinp, B * T * F, 0.0f);
    if (T == 0 || B == 0 || U == 0) return;
    const Mat wx_t = ConstMatMap(wx.flat<float>().data(), F, G).transpose();  // [4U, F]

    // Block j holds steps [lo, hi) with lo = (top - j) kBlock, j = 0 the last (maybe short) one, in
    // the order the loop below finishes them. Task j, taken by whichever thread is free (a helper
    // thread while the loop runs, both once it is done):
    //   P_j = [hm | xin | 1]_j^T dz_j      ([U + F + 1, 4U]: the block's terms of drk, dwx, dbias,
    //                                        one GEMM in the thread's scratch)
    //   dxin_j = dz_j W^T                    (the block's rows of dxin)
    //   sums += P_j, in block order          (waits for task j - 1's add, a short one)
    // so the sums are ((P_0 + P_1) + P_2) ... whichever thread computed which block: the gradients
    // do not depend on timing and training stays deterministic.
    const int64_t top = (T - 1) / kBlock, blocks = top + 1, K = U + F + 1;
    auto block_lo = [&](int64_t j) { return (top - j) * kBlock; };
    auto block_rows = [&](int64_t j) { return (std::min(block_lo(j) + kBlock, T) - block_lo(j)) * B; };
    std::mutex mu;
    std::condition_variable cv;
    int64_t done_from = T;  // dz of steps >= done_from is written (guarded by mu)
    int64_t added = 0;      // P_0 .. P_{added-1} are in the sums (guarded by mu)
    std::atomic<int64_t> next_task{0};
    auto wait_until = [&](auto ready) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, ready);
    };
    auto work = [&] {  // run tasks until none is left
      Mat lhs, terms, rows;  // [n, K] = [hm | xin | 1], P_j, dxin rows (time-major like dz)
      for (int64_t j; (j = next_task.fetch_add(1)) < blocks;) {
        const int64_t lo = block_lo(j), n = block_rows(j);
        wait_until([&] { return done_from <= lo; });
        lhs.resize(n, K);
        lhs.leftCols(U) = ConstMatMap(hmp + lo * B * U, n, U);
        for (int64_t t = lo; t < lo + n / B; ++t)
          lhs.block((t - lo) * B, U, B, F) = ConstStepMap(xinp + t * F, B, F, Stride(T * F)).matrix();
        lhs.col(K - 1).setOnes();
        const ConstMatMap dzb(dzp + lo * B * G, n, G);
        terms.noalias() = lhs.transpose() * dzb;
        rows.noalias() = dzb * wx_t;
        for (int64_t t = lo; t < lo + n / B; ++t)
          StepMap(dxinp + t * F, B, F, Stride(T * F)) = rows.middleRows((t - lo) * B, B).array();
        wait_until([&] { return added == j; });
        drk += terms.topRows(U);
        dwx += terms.middleRows(U, F);
        db += terms.row(K - 1);
        {
          std::lock_guard<std::mutex> lock(mu);
          added = j + 1;
        }
        cv.notify_all();
      }
    };
    std::thread helper(work);

    const float* kp = keep.flat<float>().data();
    const float* csp = cs.flat<float>().data();
    const float* actp = act.flat<float>().data();
    const float* cmp = cm_in.flat<float>().data();
    const float* dhsp = dhs.flat<float>().data();
    const Mat rk_t = ConstMatMap(rk.flat<float>().data(), U, G).transpose();  // [4U, U]
    Arr tc(B, U);
    Mat dhm(B, U);
    for (int64_t t = T - 1; t >= 0; --t) {
      tc = ConstArrMap(csp + t * B * U, B, U).tanh();
      float* dz = dzp + t * B * G;
      // Plain loops, vectorised by the compiler: faster than Eigen block expressions at these shapes.
      for (int64_t b = 0; b < B; ++b) {
        const float* a = actp + (t * B + b) * G;  // i, f, g, o
        const float* cm = cmp + (t * B + b) * U;
        const float* tcb = tc.data() + b * U;
        const float* dhs_b = dhsp + (b * T + t) * U;
        float* dzb = dz + b * G;
        float* dh = dhp + b * U;
        float* dc = dcp + b * U;
#pragma GCC ivdep
        for (int64_t u = 0; u < U; ++u) {  // no aliasing: inputs, dz, dh and dc are distinct buffers
          const float i = a[u], f = a[U + u], g = a[2 * U + u], o = a[3 * U + u], th = tcb[u];
          const float dhv = dh[u] + dhs_b[u];
          const float dcv = dc[u] + dhv * o * (1.0f - th * th);
          dzb[u] = dcv * g * i * (1.0f - i);
          dzb[U + u] = dcv * cm[u] * f * (1.0f - f);
          dzb[2 * U + u] = dcv * i * (1.0f - g * g);
          dzb[3 * U + u] = dhv * th * o * (1.0f - o);
          dc[u] = dcv * f;  // times keep below
        }
      }
      dhm.noalias() = ConstMatMap(dz, B, G) * rk_t;
      ConstKeepMap k(kp + t, B, Eigen::InnerStride<>(T));
      ArrMap(dhp, B, U) = dhm.array().colwise() * k;
      ArrMap(dcp, B, U).colwise() *= k;
      if (t % kBlock == 0) {  // blocks end at multiples of kBlock (the first one, at T, may be short)
        {
          std::lock_guard<std::mutex> lock(mu);
          done_from = t;
        }
        cv.notify_all();
      }
    }
    work();
    helper.join();
  }
};

REGISTER_KERNEL_BUILDER(Name("RecurrlLstmForward").Device(DEVICE_CPU), LstmForwardOp);
REGISTER_KERNEL_BUILDER(Name("RecurrlLstmBackward").Device(DEVICE_CPU), LstmBackwardOp);
