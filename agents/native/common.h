// Shared by the native op sources (lstm_op.cc, dense_op.cc): the TensorFlow names they use and
// row-major Eigen maps over float tensor buffers.
#pragma once

#include "Eigen/Core"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace recurrl {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
namespace shape_inference = tensorflow::shape_inference;

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<Mat>;
using ConstMatMap = Eigen::Map<const Mat>;
using Arr = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ArrMap = Eigen::Map<Arr>;
using ConstArrMap = Eigen::Map<const Arr>;

// An InvalidArgument status with the pieces concatenated (TF's errors::InvalidArgument is deprecated).
template <typename... Args>
absl::Status InvalidArgument(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

}  // namespace recurrl
