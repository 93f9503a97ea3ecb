// ONNX TensorProto ↔ memc Tensor: element types, raw or typed data fields, external data.
#pragma once
#include <string>

#include "ir/tensor.h"
#include "onnx/onnx_pb.h"
#include "support/status.h"

namespace memc {

// The memc dtype for an ONNX TensorProto::DataType, or an error naming the type.
Expected<DType> dtype_from_onnx(int onnx_type);
int onnx_type_from_dtype(DType dtype);

// True when the proto carries no values (a "skeleton" initializer: dims only).
bool tensor_proto_has_no_data(const onnx::TensorProto& proto);

// Decodes values; external data files resolve relative to `base_dir` and may not escape it.
// `what` names the tensor in errors ("initializer 'x'").
Expected<Tensor> tensor_from_proto(const onnx::TensorProto& proto, const std::string& base_dir);
// Shape only (for skeletons and shape inference).
Expected<Shape> shape_from_proto(const onnx::TensorProto& proto);

void tensor_to_proto(const Tensor& tensor, onnx::TensorProto& proto);

}  // namespace memc
