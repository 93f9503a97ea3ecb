// Which initializers are trainable parameters, and what an exporter's rewrites did to them.
// Today's exporters (the dynamo exporter's optimizer, value-based de-duplication) change the
// parameters a graph holds: equal-valued weights merged into one initializer, a parameter
// expanded to the traced batch and folded into a constant, a weight stored transposed under a
// new name. Each is reported in one line (once per process); the batch-expanded copy is undone
// when that is exact (every row equal): memc then trains the one row, as the model did.
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onnx/onnx_pb.h"

namespace memc {

struct ParamAudit {
  // Initializer → the shape memc trains instead ([1, rest...]): an exact batch-expanded copy.
  std::map<std::string, Shape> batch_expanded;
  // Folded transpose → the PyTorch parameter it was computed from, where the exporter's node
  // metadata names it (pkg.torch.onnx.name_scopes / fx_node of the dynamo exporter).
  std::map<std::string, std::string> folded_from;
  // Folded copies of one parameter with one layout and equal values → the first of them, which
  // memc trains for all (the export folded a shared weight once per use: ALBERT's layers).
  std::map<std::string, std::string> same_as;
  // A folded transpose whose parameter the graph also reads as an initializer of its own, with
  // equal values transposed → that initializer: the copy reads its transpose, so the two train as
  // one tensor (a tied embedding and output projection: GPT-2's wte and lm_head, BERT's MLM decoder).
  std::map<std::string, std::string> transposed_of;
  // One line per finding, in graph order (also printed as warnings).
  std::vector<std::string> findings;
};

// What onnxscript's folded_from says a folded float initializer was computed from, each source
// sorted as a module buffer (or lifted constant), a value of the exporter's own, or a parameter
// (or a module path that may be one).
struct FoldedSources {
  std::vector<std::string> parameters, buffers, values;
};
std::map<std::string, FoldedSources> folded_sources(const onnx::ModelProto& model, const std::vector<onnx::NodeProto>& nodes);

// `sources`: folded_sources(model, nodes), read once by the importer; `weights`: the
// initializers the importer trains; `updated`: those it updates as buffers (BatchNorm's running
// statistics in train()), not buffers PyTorch keeps constant; `fixed_batch`: the batch the export fixes (-1 when dynamic);
// print_warnings: also warn on stderr (off when the caller prints the findings itself, as
// inspect does); external data is read relative to `base_dir` (only for candidates of the
// batch-expanded rewrite, which are small).
ParamAudit audit_parameters(const onnx::ModelProto& model, const std::vector<onnx::NodeProto>& nodes,
                            const std::map<std::string, FoldedSources>& sources, const std::set<std::string>& weights,
                            const std::set<std::string>& updated, int64_t fixed_batch, const std::string& base_dir,
                            const std::string& file, bool print_warnings = true);

// The initializers torch.export's graph signature marks as the module's buffers (the dynamo
// exporter's value_info metadata, InputSpec kind BUFFER): PyTorch never trains them, so memc
// keeps them constant (rotary embeddings' inv_freq, for one).
std::set<std::string> exported_buffers(const onnx::ModelProto& model);

// Initializers the dynamo exporter's optimizer folded from no parameter (onnxscript's
// folded_from lists every value behind a folded constant): ALiBi slopes computed from arange,
// the ones of a LayerNorm without affine weights, a rotary buffer under a new name. PyTorch
// never trains them, so memc keeps them constant. Each maps to a phrase naming what it was
// folded from. `sources` is folded_sources'; a source there counts as a non-parameter only on
// evidence: onnxscript's own names ("val_12"), an op's output (a surviving node's, or an aten
// op's name), or a buffer or lifted constant by torch.export's graph signature or the FX graph's
// placeholders ("%b_...", "%c_..."). A module path with no such evidence may be a parameter, so
// its copy still trains.
std::map<std::string, std::string> folded_constants(const std::map<std::string, FoldedSources>& sources);

// A node's metadata_props entry (the dynamo exporter's pkg.torch.onnx.fx_node, name_scopes);
// "" when absent.
std::string node_metadata(const onnx::NodeProto& n, const std::string& key);
// The innermost module a dynamo-exported node belongs to ("encoder.layers.encoder_layer_0.mlp",
// from pkg.torch.onnx.name_scopes, whose last entry is the FX node's own name); "" without it.
std::string module_scope(const onnx::NodeProto& n);

// The module parameter `<scope>.<attribute>` that a dynamo-exported node's FX node reads (as
// "%p_<scope with _>_<attribute>", lower-cased), innermost module scope first; "" when the metadata names
// none. It tells which parameter each use of an initializer the exporter merged by value stands for.
// With `components` (as parameters_by_place's), where no scope reaches the module, the one
// placeholder under a scope whose path ends in the attribute and splits into components one way
// (`%p_<layer>_feed_forward_output_dense_bias` → `<layer>.feed_forward.output.dense.bias`).
std::string parameter_read(const onnx::NodeProto& n, const std::string& attribute,
                           const std::map<std::string, std::string>* components = nullptr);
// The one module parameter the FX node reads, whatever its attribute ("%p_<scope>_<attribute>"
// under the innermost scope that prefixes any placeholder), where the exporter merged parameters
// of different attributes (CaiT's gamma_1 and gamma_2, DINOv2's LayerNorm weight and layer-scale
// lambda1); "" when it reads none or several. Parameters in `known` (those the node's other
// inputs stand for) are not counted.
std::string single_parameter_read(const onnx::NodeProto& n, const std::set<std::string>& known = {});

// The parameters a dynamo node reads at its initializer inputs (`inputs`, their names in order),
// by its FX node's placeholders ("%p_", "%b_", "%c_") in the same order; empty unless there are as
// many, no input's own name is another place's (the FX order is the ONNX order: not so for
// addmm(bias, x, w) made a Gemm), and one input's own name is its placeholder's or one input is
// read twice. It tells apart one merged initializer
// read twice by a node (a LayerNorm's zero weight and zero bias), or read at the bias of a node
// whose weight is another merged one (LeViT's BatchNorm, weight of ones named after another
// module's weight, bias of zeros named after another's weight), which the attribute cannot.
// With `components` (every dotted component of the model's initializer names, lower-cased, to its
// spelling), a placeholder under a scope that does not reach its module (HF Reformer's reversible
// layers: scope `encoder.layers.1`, placeholder `..._layers_1_attention_layer_norm_weight`) is
// named by the components it splits into in one way only (`attention.layer_norm.weight`), and
// places whose last components are their inputs' own, all distinct, show the order too.
std::vector<std::string> parameters_by_place(const onnx::NodeProto& n, const std::vector<std::string>& inputs,
                                             const std::map<std::string, std::string>* components = nullptr);
// The parameter each placeholder among n's FX arguments names, in order (`<scope>.<attribute>`,
// "" where no scope prefixes it), with no evidence yet that they are n's inputs in that order.
std::vector<std::string> placeholder_parameters(const onnx::NodeProto& n, const std::map<std::string, std::string>* components);
// Every dotted component of the names the model keeps for its parameters: its initializers' and
// those the exporter's optimizer records a folded value was made from (pkg.onnxscript.optimizer.
// folded_from), lower-cased → spelling ("" where two spellings differ).
std::map<std::string, std::string> name_components(const onnx::ModelProto& model);
// The dotted path a mangled one ("attention_layer_norm_weight") stands for, split at underscores
// into `components` (lower-cased → spelling; "" where two spellings differ); "" unless exactly
// one split exists.
std::string dotted_path(const std::string& mangled, const std::map<std::string, std::string>& components);

// An op-output name ("embedding_1", "add_4": the dynamo exporter names folded values after the
// aten op that made them), never a module path ("encoder.ln.weight") or a plain attribute
// ("class_token").
bool op_output_name(const std::string& name);
// A module path as torch.export spells its placeholder: lower case, dots as underscores
// ("encoder.LayerNorm.weight" → "encoder_layernorm_weight").
std::string placeholder_spelling(std::string name);
// What the FX graph of a dynamo export says of names: the placeholders its nodes read, by
// torch.export's prefixes ("p_" a parameter, "b_" a buffer, "c_" a lifted constant; spelt as
// placeholder_spelling), and the values its nodes define. Empty for a TorchScript export.
struct FxNames {
  std::set<std::string> parameters, constants, defined;
};
FxNames fx_names(const std::vector<onnx::NodeProto>& nodes);
// An FX node's name that is an aten op's own ("arange", "full", "scalar_tensor", "add", …).
bool creation_op_name(const std::string& name);
// torch.export's whole graph signature, which the dynamo exporter writes on the graph: each
// target's kind (PARAMETER, BUFFER, CONSTANT_TENSOR), parameters the exporter folded away
// included. Empty without that record.
std::map<std::string, std::string> signature_kinds(const onnx::ModelProto& model);

// The FX value a dynamo node reads at input `input` where that input is an initializer the
// exporter folded and merged by value (Gemma's RMSNorm `1 + weight`, folded once per layer as
// `add_4`, `add_9`, …): the one "%<value>" argument of the FX node that names none of the node's
// other inputs, no placeholder and none of the FX values in `computed` (those the graph's nodes
// still compute: the Add of a decomposed linear reads `%view_14` under another name); where
// the FX arguments are the node's inputs one for one, the one at the input's place; for the Mul
// and Add of a decomposed addcmul, its tensor1 and its input; "" otherwise.
std::string folded_value_read(const onnx::NodeProto& n, int input, const std::set<std::string>& computed = {});

// Whether every element of `t` equals the first by value (-0 equals 0, as torch.equal has it when
// an exporter merges initializers).
bool all_elements_equal(const Tensor& t);

// Prints a parameter finding as a warning once per process (compile imports a model many times).
void warn_finding_once(const std::string& line);

// The aten op a dynamo-exported node came from, as its FX node names it
// ("_native_batch_norm_legit_functional.default"); "" when the metadata does not say.
std::string fx_target(const onnx::NodeProto& n);

// The FX value a dynamo-exported node computes ("%expand : [num_users=1] = ..." → "expand"), and
// the FX values its arguments name, in order ("args = ([%expand, %expand_1, %transpose], 1)" →
// expand, expand_1, transpose); empty when the metadata does not say.
std::string fx_value(const onnx::NodeProto& n);
// A torch.export placeholder among FX values ("p_" a parameter, "b_" a buffer, "c_" a lifted constant).
bool placeholder_value(const std::string& v);
std::vector<std::string> fx_arguments(const onnx::NodeProto& n);
// The padding index of a dynamo-exported embedding lookup: aten.embedding's third argument
// ("args = (%p_..._weight, %input_ids, 0)" → 0), which nn.Embedding(padding_idx=p) passes; -1
// when the node is no such lookup or has none.
int64_t embedding_padding_index(const onnx::NodeProto& n);

// Row 0 of a tensor whose rows are all equal ([B, rest...] → [1, rest...]).
Tensor first_row(const Tensor& t);
// A 2-D tensor transposed, any dtype: a tied folded transpose's value (ParamAudit::transposed_of)
// from its parameter's.
Tensor transpose_2d(const Tensor& t);

}  // namespace memc
