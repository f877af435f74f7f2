// Fused dense + LayerNorm + ReLU (forward and backward) as TensorFlow CPU ops.
//
// agents/networks.py's DenseReLU with layer_norm computes relu(LayerNorm(x W + b)); as TF ops that
// is about 15 ops forward and 20 backward per application, each a pass over [B, T, O] at a few
// microseconds of dispatch, and the learner applies it four times per rdqn update (target, online
// burn-in, trace, tail), all on the critical path. Here each direction is one op:
//
//   forward, per row:  y = x W + b;  mean, var over the row;  r = 1 / sqrt(var + eps);
//                      yhat = (y - mean) r;  out = max(yhat gamma + beta, 0)
//   backward, per row: da = dout [out > 0];  dgamma += da yhat;  dbeta += da;  dyhat = da gamma;
//                      dy = r (dyhat - mean(dyhat) - yhat mean(dyhat yhat));  db += dy
//   then:              dW = x^T dy;  dx = dy W^T          (two GEMMs over all rows)
//
// Rows are the leading dimensions flattened ([B, T, I] -> [B T, I]); every sum runs in row order
// on one thread, so results are deterministic. Equal to the TF layer to float32 round-off
// (tests/test_native.py). Single-threaded, like the LSTM ops: the learner's independent unrolls
// run as separate ops on TF's inter-op threads.
//
// Built with lstm_op.cc into one library by agents/native/__init__.py.

#include <cmath>

#include "common.h"

using namespace recurrl;  // NOLINT: the shared TF names and Eigen maps

namespace {

using Row = Eigen::Array<float, 1, Eigen::Dynamic>;
using RowMap = Eigen::Map<Row>;
using ConstRowMap = Eigen::Map<const Row>;

// Number of rows of a [..., I] tensor (the product of its leading dimensions). The callers check
// I >= 1 first: with I = 0 every row would be empty and the LayerNorm undefined.
int64_t Rows(const Tensor& t) { return t.NumElements() / t.dim_size(t.dims() - 1); }

}  // namespace

REGISTER_OP("RecurrlDenseLnForward")
    .Attr("epsilon: float")
    .Input("x: float")      // [..., I]
    .Input("w: float")      // [I, O]
    .Input("b: float")      // [O]
    .Input("gamma: float")  // [O] LayerNorm scale
    .Input("beta: float")   // [O] LayerNorm offset
    .Output("out: float")   // [..., O] relu(yhat gamma + beta)
    .Output("yhat: float")  // [..., O] normalised pre-activation (for the backward op)
    .Output("rstd: float")  // [...] 1 / sqrt(var + epsilon) per row (for the backward op)
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle x, w, lead, out;  // out: [..., O], lead: [...]
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &w));
      TF_RETURN_IF_ERROR(c->Subshape(x, 0, -1, &lead));
      TF_RETURN_IF_ERROR(c->Concatenate(lead, c->Vector(c->Dim(w, 1)), &out));
      c->set_output(0, out);
      c->set_output(1, out);
      c->set_output(2, lead);
      return absl::OkStatus();
    });

REGISTER_OP("RecurrlDenseLnBackward")
    .Input("dout: float")   // [..., O] gradient of out
    .Input("x: float")      // [..., I]
    .Input("w: float")      // [I, O]
    .Input("gamma: float")  // [O]
    .Input("yhat: float")   // forward outputs
    .Input("rstd: float")
    .Input("out: float")
    .Output("dx: float")      // [..., I]
    .Output("dw: float")      // [I, O]
    .Output("db: float")      // [O]
    .Output("dgamma: float")  // [O]
    .Output("dbeta: float")   // [O]
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      for (int i = 2; i < 5; ++i) c->set_output(i, c->input(3));
      return absl::OkStatus();
    });

class DenseLnForwardOp : public OpKernel {
 public:
  explicit DenseLnForwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor &x = ctx->input(0), &w = ctx->input(1), &b = ctx->input(2), &gamma = ctx->input(3),
                 &beta = ctx->input(4);
    OP_REQUIRES(ctx, x.dims() >= 2 && w.dims() == 2,
                InvalidArgument("x must be [..., I] and w [I, O], got ", x.shape().DebugString(), " and ",
                                w.shape().DebugString()));
    const int64_t in = w.dim_size(0), o = w.dim_size(1);
    OP_REQUIRES(ctx, x.dim_size(x.dims() - 1) == in,
                InvalidArgument("x ", x.shape().DebugString(), " does not match w ", w.shape().DebugString()));
    OP_REQUIRES(ctx, in >= 1, InvalidArgument("x and w need at least one input feature, got I = 0"));
    const int64_t n = Rows(x);
    for (const Tensor* v : {&b, &gamma, &beta}) {
      OP_REQUIRES(ctx, v->dims() == 1 && v->dim_size(0) == o,
                  InvalidArgument("b, gamma and beta must be [", o, "], got ", v->shape().DebugString()));
    }
    TensorShape out_shape = x.shape(), row_shape = x.shape();
    out_shape.set_dim(x.dims() - 1, o);
    row_shape.RemoveLastDims(1);
    Tensor *out_t, *yhat_t, *rstd_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, out_shape, &yhat_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, row_shape, &rstd_t));
    if (n == 0 || o == 0) return;

    MatMap y(yhat_t->flat<float>().data(), n, o);
    y.noalias() = ConstMatMap(x.flat<float>().data(), n, in) * ConstMatMap(w.flat<float>().data(), in, o);
    const ConstRowMap bias(b.flat<float>().data(), o), g(gamma.flat<float>().data(), o),
        bt(beta.flat<float>().data(), o);
    ArrMap out(out_t->flat<float>().data(), n, o);
    float* rstd = rstd_t->flat<float>().data();
    for (int64_t r = 0; r < n; ++r) {
      auto row = y.row(r).array();
      row += bias;
      row -= row.mean();
      const float rs = 1.0f / std::sqrt(row.square().mean() + epsilon_);
      rstd[r] = rs;
      row *= rs;  // now yhat
      out.row(r) = (row * g + bt).max(0.0f);
    }
  }

 private:
  float epsilon_;
};

class DenseLnBackwardOp : public OpKernel {
 public:
  explicit DenseLnBackwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor &dout = ctx->input(0), &x = ctx->input(1), &w = ctx->input(2), &gamma = ctx->input(3),
                 &yhat_t = ctx->input(4), &rstd_t = ctx->input(5), &out_t = ctx->input(6);
    OP_REQUIRES(ctx, x.dims() >= 2 && w.dims() == 2 && x.dim_size(x.dims() - 1) == w.dim_size(0),
                InvalidArgument("x must be [..., I] and w [I, O], got ", x.shape().DebugString(), " and ",
                                w.shape().DebugString()));
    const int64_t in = w.dim_size(0), o = w.dim_size(1);
    OP_REQUIRES(ctx, in >= 1, InvalidArgument("x and w need at least one input feature, got I = 0"));
    const int64_t n = Rows(x);
    for (const Tensor* t : {&dout, &yhat_t, &out_t}) {
      OP_REQUIRES(ctx, t->NumElements() == n * o,
                  InvalidArgument("dout, yhat and out must have ", n * o, " elements, got ",
                                  t->shape().DebugString()));
    }
    OP_REQUIRES(ctx, rstd_t.NumElements() == n && gamma.NumElements() == o,
                InvalidArgument("rstd must have ", n, " and gamma ", o, " elements"));
    Tensor *dx_t, *dw_t, *db_t, *dg_t, *dbeta_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, w.shape(), &dw_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({o}), &db_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({o}), &dg_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({o}), &dbeta_t));
    RowMap db(db_t->flat<float>().data(), o), dg(dg_t->flat<float>().data(), o),
        dbeta(dbeta_t->flat<float>().data(), o);
    db.setZero();
    dg.setZero();
    dbeta.setZero();
    if (n == 0 || o == 0) {
      dx_t->flat<float>().setZero();
      dw_t->flat<float>().setZero();
      return;
    }

    const ConstArrMap d(dout.flat<float>().data(), n, o), yhat(yhat_t.flat<float>().data(), n, o),
        out(out_t.flat<float>().data(), n, o);
    const ConstRowMap g(gamma.flat<float>().data(), o);
    const float* rstd = rstd_t.flat<float>().data();
    Mat dy(n, o);  // gradient of the pre-normalisation y = x W + b
    Row da(o), dyhat(o);
    const float inv_o = 1.0f / static_cast<float>(o);
    for (int64_t r = 0; r < n; ++r) {
      da = (out.row(r) > 0.0f).select(d.row(r), 0.0f);
      dg += da * yhat.row(r);
      dbeta += da;
      dyhat = da * g;
      const float m1 = dyhat.sum() * inv_o, m2 = (dyhat * yhat.row(r)).sum() * inv_o;
      dy.row(r).array() = rstd[r] * (dyhat - m1 - yhat.row(r) * m2);
      db += dy.row(r).array();
    }
    const ConstMatMap xm(x.flat<float>().data(), n, in), wm(w.flat<float>().data(), in, o);
    MatMap(dw_t->flat<float>().data(), in, o).noalias() = xm.transpose() * dy;
    MatMap(dx_t->flat<float>().data(), n, in).noalias() = dy * wm.transpose();
  }
};

REGISTER_KERNEL_BUILDER(Name("RecurrlDenseLnForward").Device(DEVICE_CPU), DenseLnForwardOp);
REGISTER_KERNEL_BUILDER(Name("RecurrlDenseLnBackward").Device(DEVICE_CPU), DenseLnBackwardOp);
