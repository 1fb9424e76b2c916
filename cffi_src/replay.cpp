// Replay of traced functions (cffi_src/replay.h). A function is kept as the
// bytes of its export file; each worker thread imports its own copy on first
// use, because MLX binds an imported graph's nodes to whichever stream of
// the device it finds first (another thread's, which this thread cannot
// evaluate on). Each call rebinds the nodes of the graph it builds to the
// calling worker's stream before the op job evaluates them.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "mlx/export.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"
#include "replay.hpp"
#include "shim.hpp"
#include "validate.hpp"

namespace emlx {

namespace {

struct Spec {
  mx::Shape shape;
  mx::Dtype dtype;
};

// One thread's import, and the graphs (by their first output's primitive)
// whose nodes are already bound to this thread's streams.
struct Instance {
  int stream_index;  // a thread id can be reused by a later thread; its stream cannot
  std::optional<mx::ImportedFunction> fn;
  std::unordered_set<const mx::Primitive*> bound;
};

struct Entry {
  std::string bytes;
  bool shapeless = false;
  std::optional<std::vector<Spec>> specs;
  // Evaluated arrays appended to every call's inputs (emlx_replay_bind): the
  // caller passes only the leading inputs.
  std::vector<mx::array> bound;
  // A chained function (emlx_replay_chain): input <- output of the thread's
  // previous chained call, and the outputs a call returns (the rest stay here).
  std::vector<std::pair<int, int>> chain;
  std::vector<int> returned;
  std::mutex mutex;
  std::unordered_map<std::thread::id, std::shared_ptr<Instance>> instances;
};

// This thread's chain: the outputs of its last chained call, by output index.
// One per worker thread: a chain is one stream's steps on its queue.
thread_local std::unordered_map<int, mx::array> chained;

std::mutex registry_mutex;
std::unordered_map<int64_t, std::shared_ptr<Entry>> registry;
int64_t next_id = 1;

std::shared_ptr<Entry> find_entry(int64_t id) {
  std::lock_guard lock(registry_mutex);
  auto it = registry.find(id);
  if (it == registry.end())
    throw std::invalid_argument("[replay] no traced function with id " + std::to_string(id) +
                                " (it was released, or never registered)");
  return it->second;
}

std::string dtype_text(mx::Dtype t) {
  std::ostringstream out;
  out << t;
  return out.str();
}

// Imports the entry's bytes through a private temporary file, unlinked at
// once: the importer keeps its descriptor open to load constants later.
mx::ImportedFunction import_bytes(const std::string& bytes) {
  auto pattern = (std::filesystem::temp_directory_path() / "emlx-replay-XXXXXX").string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  int fd = mkstemp(name.data());
  if (fd < 0) throw std::runtime_error("[replay] cannot create a temporary file to import the function");
  struct Cleanup {
    int fd;
    const char* path;
    ~Cleanup() {
      if (fd >= 0) close(fd);
      unlink(path);
    }
  } cleanup{fd, name.data()};
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) throw std::runtime_error("[replay] cannot write the temporary import file");
    done += static_cast<size_t>(n);
  }
  return mx::import_function(name.data());
}

std::shared_ptr<Instance> instance_for(Entry& entry, const mx::Stream& s) {
  std::lock_guard lock(entry.mutex);
  auto& slot = entry.instances[std::this_thread::get_id()];
  if (!slot || slot->stream_index != s.index) {
    auto made = std::make_shared<Instance>();
    made->stream_index = s.index;
    made->fn.emplace(import_bytes(entry.bytes));
    slot = made;
  }
  return slot;
}

void check_inputs(const Entry& entry, const std::vector<mx::array>& xs) {
  if (!entry.specs) return;
  const auto& specs = *entry.specs;
  if (xs.size() != specs.size())
    throw std::invalid_argument("[replay] the traced function takes " + std::to_string(specs.size()) +
                                " input(s), got " + std::to_string(xs.size()));
  for (size_t k = 0; k < xs.size(); ++k) {
    const auto& want = specs[k];
    if (xs[k].dtype() != want.dtype)
      throw std::invalid_argument("[replay] input " + std::to_string(k) + ": expected dtype " +
                                  dtype_text(want.dtype) + ", got " + dtype_text(xs[k].dtype()));
    bool same = entry.shapeless ? xs[k].ndim() == want.shape.size() : xs[k].shape() == want.shape;
    if (!same)
      throw std::invalid_argument("[replay] input " + std::to_string(k) + ": expected shape " +
                                  validate::shape_text(want.shape) +
                                  (entry.shapeless ? " (any sizes, same number of axes)" : "") + ", got " +
                                  validate::shape_text(xs[k].shape()));
  }
}

// Shapeless graphs get their shapes from each primitive's output_shapes,
// which trusts its inputs: an elementwise node or a matmul fed inconsistent
// shapes would read past a buffer. The tracer made broadcasts explicit, so
// these nodes must see equal shapes (matmul: matching inner dimensions).
const std::unordered_set<std::string>& elementwise_names() {
  static const std::unordered_set<std::string> names = {
      "Add", "Subtract", "Multiply", "Divide", "Maximum", "Minimum", "Power", "Equal", "NotEqual", "Greater",
      "GreaterEqual", "Less", "LessEqual", "LogicalAnd", "LogicalOr", "LogAddExp", "ArcTan2", "Remainder",
      "DivMod", "Select", "BitwiseBinary", "FloorDivide"};
  return names;
}

void check_node(const mx::array& a, mx::Stream sc) {
  std::string name = a.primitive().name();
  name = name.substr(0, name.find(' '));
  const auto& ins = a.inputs();
  auto fail = [&](const std::string& why) {
    std::string shapes;
    for (const auto& in : ins) shapes += (shapes.empty() ? "" : ", ") + validate::shape_text(in.shape());
    throw std::invalid_argument("[replay] these input shapes do not fit the traced function: its " + name +
                                " node " + why + " (got " + shapes + ")");
  };
  if (elementwise_names().count(name)) {
    for (const auto& in : ins)
      if (in.shape() != a.shape()) fail("needs inputs of equal shapes");
  } else if ((name == "Matmul" || name == "AddMM") && ins.size() >= 2) {
    const auto &x = ins[0], &w = ins[1];
    if (x.ndim() < 2 || w.ndim() < 2 || x.ndim() != w.ndim() || x.shape(-1) != w.shape(-2))
      fail("needs (..., M, K) @ (..., K, N)");
    for (int k = 0; k + 2 < static_cast<int>(x.ndim()); ++k)
      if (x.shape(k) != w.shape(k)) fail("needs equal batch dimensions");
    if (name == "AddMM" && ins.size() > 2 && ins[2].shape() != a.shape()) fail("needs c of the output's shape");
  } else if (name == "Gather" && !ins.empty()) {
    // Slices and constant indices (take(x, [2]) traced on a bigger x) must
    // stay inside the operand's new shape; indices that are inputs are the
    // caller's, unchecked as in plain MLX.
    auto [axes, slice_sizes] = static_cast<const mx::Gather&>(a.primitive()).state();
    const auto& operand = ins[0];
    if (slice_sizes.size() != operand.ndim()) fail("needs a slice size per axis of its operand");
    // MLX keeps the traced slice sizes: along an axis that is not indexed a
    // take's slice was the whole axis, and a different size now would give
    // a silently cropped (or overlong) result.
    for (size_t k = 0; k < slice_sizes.size(); ++k) {
      bool indexed = std::find(axes.begin(), axes.end(), static_cast<int>(k)) != axes.end();
      if (slice_sizes[k] > operand.shape(k) || (!indexed && slice_sizes[k] != operand.shape(k)))
        fail("was traced for slices of " + validate::shape_text(slice_sizes) + " along axes it does not index");
    }
    for (size_t j = 0; j + 1 < ins.size() && j < axes.size(); ++j) {
      const auto& idx = ins[j + 1];
      // A constant of the trace is available, or a Load node read once from the export.
      bool constant = idx.is_available() || (idx.has_primitive() && std::string(idx.primitive().name()) == "Load");
      if (!constant || idx.size() == 0 || !mx::issubdtype(idx.dtype(), mx::integer)) continue;
      int64_t size = operand.shape(axes[j]), extent = slice_sizes[axes[j]];
      auto wide = mx::astype(idx, mx::int64, sc);
      auto low = mx::min(wide, false, sc), high = mx::max(wide, false, sc);
      mx::eval({low, high});
      if (low.item<int64_t>() < -size || high.item<int64_t>() > size - extent)
        fail("reads a constant index outside its operand");
    }
  }
}

// Binds every node between the call's inputs and its outputs to this
// thread's streams; shapeless graphs are also checked node by node.
void bind_graph(Instance& inst, const std::vector<mx::array>& outputs, const std::vector<mx::array>& xs,
                bool shapeless, mx::Stream s, mx::Stream sc) {
  const mx::Primitive* key =
      !outputs.empty() && outputs[0].has_primitive() ? &outputs[0].primitive() : nullptr;
  bool known = key && inst.bound.count(key);
  if (known && !shapeless) return;
  std::unordered_set<uintptr_t> seen;
  for (const auto& x : xs) seen.insert(x.id());
  std::vector<mx::array> stack(outputs.begin(), outputs.end());
  while (!stack.empty()) {
    mx::array a = stack.back();
    stack.pop_back();
    if (!seen.insert(a.id()).second || !a.has_primitive()) continue;
    auto& p = a.primitive();
    if (!known) {
      // The stream is a plain member the primitive exposes by const
      // reference; nothing else holds these nodes while this thread does.
      auto& stream = const_cast<mx::Stream&>(p.stream());
      stream = stream.device == mx::Device::cpu ? sc : s;
    }
    if (shapeless) check_node(a, sc);
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
  if (key) inst.bound.insert(key);
}

}  // namespace

namespace {

// A chained input for a longer trace than the one that made it (a KV cache
// moving to the next length): zeros after its end, where the spec is larger.
mx::array fit_chained(const mx::array& x, const Spec& want, int input, mx::Stream sc) {
  if (x.shape() == want.shape && x.dtype() == want.dtype) return x;
  bool grows = x.dtype() == want.dtype && x.ndim() == want.shape.size();
  std::vector<std::pair<int, int>> widths;
  for (size_t d = 0; grows && d < want.shape.size(); ++d) {
    grows = x.shape(d) <= want.shape[d];
    widths.emplace_back(0, grows ? want.shape[d] - x.shape(d) : 0);
  }
  if (!grows)
    throw std::invalid_argument("[replay] chained input " + std::to_string(input) + " of shape " +
                                validate::shape_text(x.shape()) + " does not fit the expected " +
                                validate::shape_text(want.shape));
  return mx::pad(x, widths, mx::array(0, x.dtype()), "constant", sc);
}

}  // namespace

std::vector<mx::array> replay_call(const std::vector<mx::array>& given, int64_t id, bool fed, mx::Stream s,
                                   mx::Stream sc) {
  auto entry = find_entry(id);
  if (fed && entry->chain.empty())
    throw std::invalid_argument("[replay] fed=True needs a function made by chain()");
  std::vector<mx::array> xs(given);
  xs.insert(xs.end(), entry->bound.begin(), entry->bound.end());
  if (fed) {
    if (chained.empty())
      throw std::invalid_argument("[replay] fed=True, but no chained call ran on this queue before it");
    for (auto [input, output] : entry->chain) {
      auto it = chained.find(output);
      if (it == chained.end() || input >= static_cast<int>(xs.size()))
        throw std::invalid_argument("[replay] the previous chained call did not make output " +
                                    std::to_string(output));
      // Moved out: the graph holds the only reference, so MLX may update it in place.
      xs[input] = entry->specs ? fit_chained(it->second, (*entry->specs)[input], input, sc) : it->second;
    }
    chained.clear();
  }
  check_inputs(*entry, xs);
  auto inst = instance_for(*entry, s);
  auto outputs = (*inst->fn)(xs);
  bind_graph(*inst, outputs, xs, entry->shapeless, s, sc);
  if (entry->chain.empty()) return outputs;
  chained.clear();
  for (auto [input, output] : entry->chain)
    if (output < static_cast<int>(outputs.size())) chained.insert_or_assign(output, outputs[output]);
  std::vector<mx::array> returned;
  for (int k : entry->returned)
    if (k < static_cast<int>(outputs.size())) returned.push_back(outputs[k]);
  return returned;
}

}  // namespace emlx

extern "C" {

int emlx_replay_register(const char* path, int shapeless, int n_inputs, const int* ndims, const int64_t* shapes,
                         const int* dtypes, int64_t* id) {
  return emlx::guarded([&] {
    auto entry = std::make_shared<emlx::Entry>();
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument(std::string("[replay] cannot open ") + path);
    std::ostringstream buffer;
    buffer << in.rdbuf();
    entry->bytes = buffer.str();
    entry->shapeless = shapeless != 0;
    if (n_inputs >= 0) {
      std::vector<emlx::Spec> specs;
      size_t at = 0;
      for (int k = 0; k < n_inputs; ++k) {
        mx::Shape shape;
        for (int d = 0; d < ndims[k]; ++d) shape.push_back(static_cast<int>(shapes[at++]));
        specs.push_back({std::move(shape), emlx::dtype_of(dtypes[k])});
      }
      entry->specs = std::move(specs);
    }
    // Import once here so that a file MLX cannot read fails now, not on a worker.
    emlx::import_bytes(entry->bytes);
    std::lock_guard lock(emlx::registry_mutex);
    *id = emlx::next_id++;
    emlx::registry.emplace(*id, std::move(entry));
    return 0;
  });
}

int emlx_replay_bind(int64_t id, void** arrays, size_t count, int64_t* bound_id) {
  return emlx::guarded([&] {
    auto entry = emlx::find_entry(id);
    auto made = std::make_shared<emlx::Entry>();
    made->bytes = entry->bytes;
    made->shapeless = entry->shapeless;
    made->specs = entry->specs;
    made->chain = entry->chain;
    made->returned = entry->returned;
    {
      emlx::GilGuard gil;  // handles can be swapped by in-place ops on other threads
      for (size_t i = 0; i < count; ++i) made->bound.push_back(emlx::array_of(arrays[i]));
    }
    // These come just before the inputs bound already.
    made->bound.insert(made->bound.end(), entry->bound.begin(), entry->bound.end());
    size_t inputs = made->specs ? made->specs->size() : 0;
    if (made->specs && made->bound.size() > inputs)
      throw std::invalid_argument("[replay] cannot bind " + std::to_string(count) + " array(s): the function takes " +
                                  std::to_string(inputs) + " input(s)" +
                                  (entry->bound.empty() ? "" : ", " + std::to_string(entry->bound.size()) +
                                                                   " of them bound already"));
    for (size_t k = 0; k < made->bound.size(); ++k) {
      const auto& x = made->bound[k];
      // Any worker reads them, concurrently: only evaluated arrays can be shared.
      if (!x.is_available())
        throw std::invalid_argument("[replay] bound array " + std::to_string(k) +
                                    " is not evaluated (mx.eval it on the thread that built it first)");
      if (made->specs) {
        const auto& want = (*made->specs)[inputs - made->bound.size() + k];
        if (x.dtype() != want.dtype || (!made->shapeless && x.shape() != want.shape))
          throw std::invalid_argument("[replay] bound array " + std::to_string(k) + " does not fit input " +
                                      std::to_string(inputs - made->bound.size() + k) + " (expected " +
                                      emlx::validate::shape_text(want.shape) + " " + emlx::dtype_text(want.dtype) +
                                      ", got " + emlx::validate::shape_text(x.shape()) + " " +
                                      emlx::dtype_text(x.dtype()) + ")");
      }
    }
    std::lock_guard lock(emlx::registry_mutex);
    *bound_id = emlx::next_id++;
    emlx::registry.emplace(*bound_id, std::move(made));
    return 0;
  });
}

int emlx_replay_chain(int64_t id, const int* inputs, const int* outputs, size_t count, const int* returned,
                      size_t n_returned, int64_t* chained_id) {
  return emlx::guarded([&] {
    auto entry = emlx::find_entry(id);
    if (!entry->chain.empty()) throw std::invalid_argument("[replay] this function is chained already");
    auto made = std::make_shared<emlx::Entry>();
    made->bytes = entry->bytes;
    made->shapeless = entry->shapeless;
    made->specs = entry->specs;
    made->bound = entry->bound;
    for (size_t k = 0; k < count; ++k) {
      if (inputs[k] < 0 || outputs[k] < 0 || (made->specs && inputs[k] >= static_cast<int>(made->specs->size())))
        throw std::invalid_argument("[replay] chain: input " + std::to_string(inputs[k]) + " or output " +
                                    std::to_string(outputs[k]) + " does not exist");
      made->chain.emplace_back(inputs[k], outputs[k]);
    }
    made->returned.assign(returned, returned + n_returned);
    std::lock_guard lock(emlx::registry_mutex);
    *chained_id = emlx::next_id++;
    emlx::registry.emplace(*chained_id, std::move(made));
    return 0;
  });
}

void emlx_replay_end_chain(void) { emlx::chained.clear(); }

int emlx_replay_release(int64_t id) {
  return emlx::guarded([&] {
    std::lock_guard lock(emlx::registry_mutex);
    if (!emlx::registry.erase(id)) throw std::invalid_argument("[replay] unknown function id " + std::to_string(id));
    return 0;
  });
}

int64_t emlx_replay_count(void) {
  std::lock_guard lock(emlx::registry_mutex);
  return static_cast<int64_t>(emlx::registry.size());
}

}  // extern "C"
