#include "frontend/onnx_weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "frontend/onnx_tensor.h"
#include "support/atomic_file.h"

namespace memc {

namespace {

Status load_model(const std::string& path, onnx::ModelProto& model) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::BadInput(path + ": cannot open model file");
  if (!model.ParseFromIstream(&in)) return Status::BadInput(path + ": not a valid ONNX model (protobuf parse failed)");
  return Status::Ok();
}

std::string folder_of(const std::string& path) {
  std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

}  // namespace

Status stream_onnx_initializers(const std::string& path, const std::set<std::string>& names,
                                const std::function<Status(const std::string& name, const Tensor& value)>& sink) {
  onnx::ModelProto model;
  MEMC_RETURN_IF_ERROR(load_model(path, model));
  std::set<std::string> seen;
  for (auto& init : *model.mutable_graph()->mutable_initializer()) {
    if (!names.count(init.name())) continue;
    Expected<Tensor> t = tensor_from_proto(init, folder_of(path));
    if (!t.ok()) return t.status().with_context(path + ": initializer '" + init.name() + "': ");
    std::string().swap(*init.mutable_raw_data());  // the proto's copy goes once decoded (clear() would keep its capacity)
    MEMC_RETURN_IF_ERROR(sink(init.name(), *t));
    seen.insert(init.name());
  }
  for (const std::string& n : names) {
    if (!seen.count(n)) return Status::BadInput(path + ": no initializer named '" + n + "'");
  }
  return Status::Ok();
}

Expected<std::vector<std::string>> onnx_external_data_files(const std::string& path) {
  onnx::ModelProto model;
  MEMC_RETURN_IF_ERROR(load_model(path, model));
  std::vector<std::string> files;
  for (const auto& init : model.graph().initializer()) {
    for (const auto& kv : init.external_data()) {
      if (kv.key() == "location" && std::find(files.begin(), files.end(), kv.value()) == files.end()) files.push_back(kv.value());
    }
  }
  return files;
}

Status write_onnx_with_weights(const std::string& in_path, const std::string& out_path,
                               const std::map<std::string, Tensor>& weights, const std::vector<UntiedUse>& untied) {
  onnx::ModelProto model;
  MEMC_RETURN_IF_ERROR(load_model(in_path, model));
  auto* graph = model.mutable_graph();
  std::set<std::string> added, copied;
  // The copies of nodes first, as the model file has the originals: their own uses follow.
  for (const UntiedUse& u : untied) {
    if (!u.copy_of.empty() && copied.insert(u.node).second) {
      auto* nodes = graph->mutable_node();
      const auto original = std::find_if(nodes->begin(), nodes->end(), [&](const onnx::NodeProto& n) { return n.name() == u.copy_of; });
      const auto reader = std::find_if(nodes->begin(), nodes->end(), [&](const onnx::NodeProto& n) { return n.name() == u.reader; });
      if (original == nodes->end() || original->output_size() != 1 || reader == nodes->end() || u.reader_input < 0 ||
          u.reader_input >= reader->input_size() || reader->input(u.reader_input) != original->output(0)) {
        return Status::BadInput(str_cat(in_path, ": no node '", u.reader, "' reading node '", u.copy_of, "' at input ", u.reader_input,
                                        " to give a copy '", u.node, "'"));
      }
      reader->set_input(u.reader_input, u.node);
      onnx::NodeProto copy = *original;
      copy.set_name(u.node);
      copy.set_output(0, u.node);
      const auto at = original - nodes->begin() + 1;
      *nodes->Add() = std::move(copy);
      std::rotate(nodes->begin() + at, nodes->end() - 1, nodes->end());  // right after the original, before its readers
    }
  }
  for (const UntiedUse& u : untied) {
    if (u.source.empty()) {
      // A bias the exporter removed for being zero: the node gets it back where it was trained
      // (a frozen one stays zero, as the node without it computes).
      auto* nodes = graph->mutable_node();
      const auto node = std::find_if(nodes->begin(), nodes->end(), [&](const onnx::NodeProto& n) { return n.name() == u.node; });
      if (node == nodes->end() || node->input_size() != u.input) {
        return Status::BadInput(str_cat(in_path, ": no node '", u.node, "' with ", u.input, " inputs to give its bias '", u.name, "'"));
      }
      const auto value = weights.find(u.name);
      if (value == weights.end() || !added.insert(u.name).second) continue;
      onnx::TensorProto bias;
      tensor_to_proto(value->second, bias);
      bias.set_name(u.name);
      *graph->add_initializer() = std::move(bias);
      node->add_input(u.name);
      continue;
    }
    const auto& inits = graph->initializer();
    const auto init = std::find_if(inits.begin(), inits.end(), [&](const auto& i) { return i.name() == u.source; });
    auto* nodes = graph->mutable_node();
    const auto node = std::find_if(nodes->begin(), nodes->end(), [&](const onnx::NodeProto& n) {
      return u.input < 0 ? n.op_type() == "Identity" && n.output_size() == 1 && n.output(0) == u.name && n.input_size() == 1 && n.input(0) == u.source
                         : n.name() == u.node;
    });
    const bool found = init != inits.end() && node != nodes->end() && (u.input < 0 || (u.input < node->input_size() && node->input(u.input) == u.source));
    if (!found) return Status::BadInput(str_cat(in_path, ": no use of initializer '", u.source, "' by node '", u.node, "' to give '", u.name, "'"));
    if (added.insert(u.name).second) {
      onnx::TensorProto copy = *init;
      copy.set_name(u.name);
      *graph->add_initializer() = std::move(copy);
    }
    if (u.input < 0) nodes->erase(node);
    else node->set_input(u.input, u.name);
  }
  std::set<std::string> written;
  const std::string base = folder_of(in_path);
  int64_t inline_bytes = 0;
  for (auto& init : *model.mutable_graph()->mutable_initializer()) {
    auto it = weights.find(init.name());
    if (it == weights.end()) {
      // Untouched initializers stored externally are pulled inline so the copy stands alone.
      if (init.data_location() == onnx::TensorProto::EXTERNAL) {
        Expected<Tensor> t = tensor_from_proto(init, base);
        if (!t.ok()) return t.status().with_context(in_path + ": initializer '" + init.name() + "': ");
        tensor_to_proto(*t, init);
      }
      inline_bytes += static_cast<int64_t>(init.raw_data().size());
      continue;
    }
    MEMC_ASSIGN_OR_RETURN(DType dtype, dtype_from_onnx(init.data_type()));
    MEMC_ASSIGN_OR_RETURN(Shape shape, shape_from_proto(init));
    Tensor value = it->second;
    if (shape != value.shape() && !shape.empty() && value.rank() == static_cast<int64_t>(shape.size()) && value.shape()[0] == 1 &&
        Shape(shape.begin() + 1, shape.end()) == Shape(value.shape().begin() + 1, value.shape().end())) {
      // A batch-expanded copy trained as one row (frontend/param_audit.h): written back expanded.
      Tensor full = Tensor::zeros(value.dtype(), shape);
      for (int64_t r = 0; r < shape[0]; ++r) std::memcpy(static_cast<char*>(full.raw()) + r * value.nbytes(), value.raw(), value.nbytes());
      value = std::move(full);
    }
    if (shape != value.shape()) {
      return Status::BadInput(str_cat("weight '", init.name(), "' has shape [", shape_str(it->second.shape()),
                                      "], the model's initializer [", shape_str(shape), "]"));
    }
    const std::string name = init.name();
    tensor_to_proto(value.dtype() == dtype ? value : value.cast(dtype), init);
    init.set_name(name);
    inline_bytes += static_cast<int64_t>(init.raw_data().size());
    written.insert(name);
  }
  for (const auto& [name, t] : weights) {
    if (!written.count(name)) return Status::BadInput(in_path + ": no initializer named '" + name + "' to write");
  }
  if (inline_bytes > (int64_t{1} << 30) * 3 / 2) {
    return Status::BadInput(str_cat("the model's weights (", inline_bytes, " bytes) pass protobuf's 2 GB limit; external-data export is not supported yet"));
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes)) return Status::Internal("cannot serialize the ONNX model");
  return write_file_atomic(out_path, bytes);
}

std::vector<UntiedUse> untied_uses(const Attrs& metadata) {
  std::vector<UntiedUse> uses;
  const Attr* list = metadata.find("untied_uses");
  const auto* names = list ? std::get_if<std::vector<std::string>>(list) : nullptr;
  for (size_t i = 0; names && i + 3 < names->size(); i += 4) {
    uses.push_back({(*names)[i], (*names)[i + 1], (*names)[i + 2], std::stoi((*names)[i + 3])});
  }
  const Attr* copies = metadata.find("untied_copies");
  const auto* fields = copies ? std::get_if<std::vector<std::string>>(copies) : nullptr;
  for (size_t i = 0; fields && i + 3 < fields->size(); i += 4) {
    for (UntiedUse& u : uses) {
      if (u.node != (*fields)[i]) continue;
      u.copy_of = (*fields)[i + 1];
      u.reader = (*fields)[i + 2];
      u.reader_input = std::stoi((*fields)[i + 3]);
    }
  }
  return uses;
}

}  // namespace memc
