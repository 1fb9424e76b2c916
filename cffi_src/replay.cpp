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
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "mlx/distributed/distributed.h"
#include "mlx/distributed/ops.h"
#include "mlx/export.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"
#include "export_file.hpp"
#include "replay.hpp"
#include "shim.hpp"
#include "validate.hpp"

namespace mx = mlx::core;

namespace emlx {

namespace {

using export_file::Spec;
using export_file::Trace;

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
  // What the file declares (export_file::check): a call's inputs, bound
  // ones included, must match one trace, and its outputs are that trace's.
  std::vector<Trace> traces;
  // Evaluated arrays appended to every call's inputs (emlx_replay_bind): the
  // caller passes only the leading inputs.
  std::vector<mx::array> bound;
  // A chained function (emlx_replay_chain): input <- output of the thread's
  // previous chained call, and the outputs a call returns (the rest stay here).
  std::vector<std::pair<int, int>> chain;
  std::vector<int> returned;
  // A function traced by a distributed group (emlx_replay_set_group): its
  // collectives, placed at each call (place_collectives), run over this group.
  std::optional<mx::distributed::Group> group;
  bool grouped = false;  // its markers are expected: set with a group, or for a verification run
  bool group_on_gpu = false;  // NCCL's collectives run on the GPU stream; the others' on the CPU's
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

const Trace& find_trace(const Entry& entry, int64_t trace) {
  if (trace < 0 || trace >= static_cast<int64_t>(entry.traces.size()))
    throw std::invalid_argument("[replay] no trace " + std::to_string(trace));
  return entry.traces[trace];
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

bool fits(const Entry& entry, const Spec& want, const mx::array& x) {
  return x.dtype() == want.dtype &&
         (entry.shapeless ? x.ndim() == want.shape.size() : x.shape() == want.shape);
}

std::string spec_text(const Entry& entry, const Spec& want) {
  return validate::shape_text(want.shape) + " " + validate::dtype_text(want.dtype) +
         (entry.shapeless ? " (any sizes, same number of axes)" : "");
}

// The trace the inputs match (MLX picks the same one); a clear error when none does.
const Trace& check_inputs(const Entry& entry, const std::vector<mx::array>& xs) {
  for (const auto& trace : entry.traces) {
    if (trace.inputs.size() != xs.size()) continue;
    size_t k = 0;
    while (k < xs.size() && fits(entry, trace.inputs[k], xs[k])) ++k;
    if (k == xs.size()) return trace;
  }
  if (entry.traces.size() == 1) {
    const auto& specs = entry.traces[0].inputs;
    if (xs.size() != specs.size())
      throw std::invalid_argument("[replay] the traced function takes " + std::to_string(specs.size()) +
                                  " input(s), got " + std::to_string(xs.size()));
    for (size_t k = 0; k < xs.size(); ++k) {
      const auto& want = specs[k];
      if (xs[k].dtype() != want.dtype)
        throw std::invalid_argument("[replay] input " + std::to_string(k) + ": expected dtype " +
                                    validate::dtype_text(want.dtype) + ", got " + validate::dtype_text(xs[k].dtype()));
      if (!fits(entry, want, xs[k]))
        throw std::invalid_argument("[replay] input " + std::to_string(k) + ": expected shape " +
                                    validate::shape_text(want.shape) +
                                    (entry.shapeless ? " (any sizes, same number of axes)" : "") + ", got " +
                                    validate::shape_text(xs[k].shape()));
    }
  }
  std::string traces, got;
  for (const auto& trace : entry.traces) {
    std::string one;
    for (const auto& spec : trace.inputs) one += (one.empty() ? "" : ", ") + spec_text(entry, spec);
    traces += "\n  (" + one + ")";
  }
  for (const auto& x : xs)
    got += (got.empty() ? "" : ", ") + validate::shape_text(x.shape()) + " " + validate::dtype_text(x.dtype());
  throw std::invalid_argument("[replay] the inputs (" + got + ") match none of the function's " +
                              std::to_string(entry.traces.size()) + " traces:" + traces);
}

// Shapeless graphs get their shapes from each primitive's output_shapes,
// which trusts its inputs: an elementwise node or a matmul fed inconsistent
// shapes would read past a buffer, so each call's graph is checked node by
// node (export_file::check_node: the checks the file passed when loaded).

// Calls visit(node) once for each node between a call's inputs and its
// outputs, before reading the node's inputs (visit may change them).
template <typename Visit>
void walk_graph(const std::vector<mx::array>& outputs, const std::vector<mx::array>& xs, Visit visit) {
  std::unordered_set<uintptr_t> seen;
  for (const auto& x : xs) seen.insert(x.id());
  std::vector<mx::array> stack(outputs.begin(), outputs.end());
  while (!stack.empty()) {
    mx::array a = stack.back();
    stack.pop_back();
    if (!seen.insert(a.id()).second || !a.has_primitive()) continue;
    visit(a);
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
}

// MLX cannot export a collective, so a function traced by a group holds a
// marker where it called all_sum: mx.depends([x], [x]), a node no model
// makes (its one input given twice). Each call's graph gets an AllReduce
// over the group in its place, on the stream the backend runs on.
bool is_collective_marker(const mx::array& a) {
  return a.has_primitive() && std::string_view(a.primitive().name()) == "Depends" && a.inputs().size() == 2 &&
         a.inputs()[0].id() == a.inputs()[1].id() && a.siblings().empty();
}

// Binds every node between the call's inputs and its outputs to this
// thread's streams; shapeless graphs are also checked node by node.
void bind_graph(Instance& inst, const std::vector<mx::array>& outputs, const std::vector<mx::array>& xs,
                bool shapeless, bool grouped, mx::Stream s, mx::Stream sc) {
  const mx::Primitive* key =
      !outputs.empty() && outputs[0].has_primitive() ? &outputs[0].primitive() : nullptr;
  bool known = key && inst.bound.count(key);
  if (known && !shapeless) return;
  walk_graph(outputs, xs, [&](mx::array& a) {
    // Run without its group, each all_sum would give its own rank's part alone.
    if (!grouped && is_collective_marker(a))
      throw std::invalid_argument(
          "[replay] this function was traced by an ea.distributed group (it holds its all_sum markers): "
          "load it with group.load_traced(path)");
    if (!known) {
      // Nothing else holds these nodes while this thread does.
      auto& stream = mlx_internals::stream_of(a.primitive());
      stream = stream.device == mx::Device::cpu ? sc : s;
    }
    if (shapeless) export_file::check_node(a, sc, true);
  });
  if (key) inst.bound.insert(key);
}

void place_collectives(const std::vector<mx::array>& outputs, const std::vector<mx::array>& xs,
                       const mx::distributed::Group& group, mx::Stream s) {
  if (group.size() == 1) return;  // all_sum over one rank is its input: what the marker gives
  walk_graph(outputs, xs, [&](mx::array& a) {
    if (!is_collective_marker(a)) return;
    // MLX's all_sum makes the AllReduce node (its class is not exported).
    // This call's node alone changes: the imported graph keeps its marker for the next.
    auto reduced = mx::distributed::all_sum(a.inputs()[0], group, s);
    if (reduced.id() != a.inputs()[0].id() && reduced.has_primitive()) {
      a.primitive_ptr() = reduced.primitive_ptr();
      a.inputs().pop_back();  // the second x
    }
  });
}

}  // namespace

namespace {

// A chained input for a longer trace than the one that made it (a KV cache
// moving to the next length): zeros after its end, where the spec is larger.
mx::array fit_chained(const mx::array& x, const Spec& want, bool shapeless, int input, mx::Stream sc) {
  if (x.shape() == want.shape && x.dtype() == want.dtype) return x;
  // A shapeless trace takes any sizes: padding to its example's would refuse a larger input.
  if (shapeless && x.ndim() == want.shape.size() && x.dtype() == want.dtype) return x;
  bool grows = x.dtype() == want.dtype && x.ndim() == want.shape.size();
  std::vector<std::pair<int, int>> widths;
  for (size_t d = 0; grows && d < want.shape.size(); ++d) {
    grows = x.shape(d) <= want.shape[d];
    widths.emplace_back(0, grows ? want.shape[d] - x.shape(d) : 0);
  }
  if (!grows)
    throw std::invalid_argument("[replay] chained input " + std::to_string(input) + " of " +
                                validate::shape_text(x.shape()) + " " + validate::dtype_text(x.dtype()) +
                                " does not fit the expected " + validate::shape_text(want.shape) + " " +
                                validate::dtype_text(want.dtype));
  return mx::pad(x, widths, mx::array(0, x.dtype()), "constant", sc);
}

std::string index_error(const char* what, int index, size_t count) {
  return std::string("[replay] ") + what + " " + std::to_string(index) + " does not exist: the function makes " +
         std::to_string(count) + " output(s)";
}

// The fewest outputs any trace makes: an output index below it exists whichever trace a call matches.
size_t fewest_outputs(const Entry& entry) {
  size_t n = SIZE_MAX;
  for (const auto& trace : entry.traces) n = std::min(n, trace.n_outputs);
  return entry.traces.empty() ? 0 : n;
}

std::shared_ptr<Entry> copy_entry(const Entry& entry) {
  auto made = std::make_shared<Entry>();
  made->bytes = entry.bytes;
  made->shapeless = entry.shapeless;
  made->traces = entry.traces;
  made->bound = entry.bound;
  made->chain = entry.chain;
  made->returned = entry.returned;
  made->group = entry.group;
  made->grouped = entry.grouped;
  made->group_on_gpu = entry.group_on_gpu;
  return made;
}

int64_t add_entry(std::shared_ptr<Entry> entry) {
  std::lock_guard lock(registry_mutex);
  int64_t id = next_id++;
  registry.emplace(id, std::move(entry));
  return id;
}

}  // namespace

void end_chain() { chained.clear(); }

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
      if (it == chained.end() || input < 0 || input >= static_cast<int>(xs.size()))
        throw std::invalid_argument("[replay] the previous chained call did not make output " +
                                    std::to_string(output));
      // Moved out: the graph holds the only reference, so MLX may update it in place.
      xs[input] = entry->traces.size() == 1
                      ? fit_chained(it->second, entry->traces[0].inputs[input], entry->shapeless, input, sc)
                      : it->second;
    }
  }
  const Trace& trace = check_inputs(*entry, xs);
  // Every index a caller gave was checked against the trace when it was
  // known; with several traces, this call's trace decides.
  for (auto [input, output] : entry->chain)
    if (output < 0 || static_cast<size_t>(output) >= trace.n_outputs)
      throw std::invalid_argument(index_error("chained output", output, trace.n_outputs));
  for (int k : entry->returned)
    if (k < 0 || static_cast<size_t>(k) >= trace.n_outputs)
      throw std::invalid_argument(index_error("returned output", k, trace.n_outputs));
  // Only once every check passed: a refused call leaves the chain for the next one.
  // Dropped before the run, so the graph holds the only reference (MLX may update in place).
  if (fed) chained.clear();
  auto inst = instance_for(*entry, s);
  auto outputs = (*inst->fn)(xs);
  if (outputs.size() != trace.n_outputs)
    throw std::invalid_argument("[replay] the imported function made " + std::to_string(outputs.size()) +
                                " outputs where its file declares " + std::to_string(trace.n_outputs));
  bind_graph(*inst, outputs, xs, entry->shapeless, entry->grouped, s, sc);
  // After the binding, whose cache is keyed by the imported graph's own nodes.
  if (entry->group) place_collectives(outputs, xs, *entry->group, entry->group_on_gpu ? s : sc);
  if (entry->chain.empty()) return outputs;
  chained.clear();
  for (auto [input, output] : entry->chain) chained.insert_or_assign(output, outputs[output]);
  std::vector<mx::array> returned;
  for (int k : entry->returned) returned.push_back(outputs[k]);
  return returned;
}

}  // namespace emlx

extern "C" {

int emlx_replay_register(const char* data, size_t size, int64_t* id) {
  return emlx::guarded([&] {
    auto entry = std::make_shared<emlx::Entry>();
    // Checked before MLX's importer sees it: MLX trusts every count and shape.
    auto summary = emlx::export_file::check(data, size);
    entry->bytes.assign(data, size);
    entry->shapeless = summary.shapeless;
    entry->traces = std::move(summary.traces);
    // Import once here so that a file MLX cannot read fails now, not on a worker.
    emlx::import_bytes(entry->bytes);
    *id = emlx::add_entry(std::move(entry));
    return 0;
  });
}

int emlx_replay_info(int64_t id, int* shapeless, int64_t* n_traces, int64_t* n_bound) {
  return emlx::guarded([&] {
    auto entry = emlx::find_entry(id);
    *shapeless = entry->shapeless;
    *n_traces = static_cast<int64_t>(entry->traces.size());
    *n_bound = static_cast<int64_t>(entry->bound.size());
    return 0;
  });
}

int emlx_replay_trace_info(int64_t id, int64_t trace, int64_t* n_inputs, int64_t* n_outputs, int64_t* n_dims) {
  return emlx::guarded([&] {
    auto entry = emlx::find_entry(id);
    const auto& t = emlx::find_trace(*entry, trace);
    *n_inputs = static_cast<int64_t>(t.inputs.size());
    *n_outputs = static_cast<int64_t>(t.n_outputs);
    int64_t dims = 0;
    for (const auto& spec : t.inputs) dims += static_cast<int64_t>(spec.shape.size());
    *n_dims = dims;
    return 0;
  });
}

int emlx_replay_trace_inputs(int64_t id, int64_t trace, int* ndims, int64_t* dims, int* dtypes) {
  return emlx::guarded([&] {
    auto entry = emlx::find_entry(id);
    size_t at = 0, k = 0;
    for (const auto& spec : emlx::find_trace(*entry, trace).inputs) {
      ndims[k] = static_cast<int>(spec.shape.size());
      dtypes[k++] = static_cast<int>(spec.dtype.val());  // the codes of emlx::dtype_of
      for (auto d : spec.shape) dims[at++] = d;
    }
    return 0;
  });
}

int emlx_replay_bind(int64_t id, void** arrays, size_t count, int64_t* bound_id) {
  return emlx::guarded([&] {
    auto entry = emlx::find_entry(id);
    auto made = emlx::copy_entry(*entry);
    std::vector<mx::array> bound;
    {
      emlx::GilGuard gil;  // handles can be swapped by in-place ops on other threads
      for (size_t i = 0; i < count; ++i) bound.push_back(emlx::array_of(arrays[i]));
    }
    // These come just before the inputs bound already.
    bound.insert(bound.end(), entry->bound.begin(), entry->bound.end());
    for (size_t k = 0; k < bound.size(); ++k)
      // Any worker reads them, concurrently: only evaluated arrays can be shared.
      if (!bound[k].is_available())
        throw std::invalid_argument("[replay] bound array " + std::to_string(k) +
                                    " is not evaluated (mx.eval it on the thread that built it first)");
    // Keep the traces the bound arrays fit as their last inputs.
    std::string why;
    made->traces.clear();
    for (const auto& trace : entry->traces) {
      size_t inputs = trace.inputs.size();
      if (bound.size() > inputs) {
        why = "cannot bind " + std::to_string(count) + " array(s): the function takes " + std::to_string(inputs) +
              " input(s)" + (entry->bound.empty() ? "" : ", " + std::to_string(entry->bound.size()) +
                                                             " of them bound already");
        continue;
      }
      size_t k = 0;
      for (; k < bound.size(); ++k) {
        const auto& want = trace.inputs[inputs - bound.size() + k];
        const auto& x = bound[k];
        // Shapeless: any sizes, but the number of axes is the trace's (each call checks it too).
        if (x.dtype() != want.dtype ||
            (entry->shapeless ? x.ndim() != want.shape.size() : x.shape() != want.shape)) {
          why = "bound array " + std::to_string(k) + " does not fit input " +
                std::to_string(inputs - bound.size() + k) + " (expected " +
                emlx::validate::shape_text(want.shape) + " " + emlx::validate::dtype_text(want.dtype) + ", got " +
                emlx::validate::shape_text(x.shape()) + " " + emlx::validate::dtype_text(x.dtype()) + ")";
          break;
        }
      }
      if (k == bound.size()) made->traces.push_back(trace);
    }
    if (made->traces.empty()) throw std::invalid_argument("[replay] " + why);
    made->bound = std::move(bound);
    *bound_id = emlx::add_entry(std::move(made));
    return 0;
  });
}

int emlx_replay_chain(int64_t id, const int* inputs, const int* outputs, size_t count, const int* returned,
                      size_t n_returned, int64_t* chained_id) {
  return emlx::guarded([&] {
    auto entry = emlx::find_entry(id);
    if (!entry->chain.empty()) throw std::invalid_argument("[replay] this function is chained already");
    auto made = emlx::copy_entry(*entry);
    size_t fewest_inputs = SIZE_MAX;
    for (const auto& trace : entry->traces) fewest_inputs = std::min(fewest_inputs, trace.inputs.size());
    size_t n_outputs = emlx::fewest_outputs(*entry);
    for (size_t k = 0; k < count; ++k) {
      if (inputs[k] < 0 || static_cast<size_t>(inputs[k]) >= fewest_inputs)
        throw std::invalid_argument("[replay] chain: input " + std::to_string(inputs[k]) +
                                    " does not exist: the function takes " + std::to_string(fewest_inputs) +
                                    " input(s)");
      if (outputs[k] < 0 || static_cast<size_t>(outputs[k]) >= n_outputs)
        throw std::invalid_argument(emlx::index_error("chain: output", outputs[k], n_outputs));
      made->chain.emplace_back(inputs[k], outputs[k]);
    }
    for (size_t k = 0; k < n_returned; ++k)
      if (returned[k] < 0 || static_cast<size_t>(returned[k]) >= n_outputs)
        throw std::invalid_argument(emlx::index_error("chain: returned output", returned[k], n_outputs));
    if (count == 0 || n_returned == 0)
      throw std::invalid_argument("[replay] chain needs at least one carried and one returned output");
    made->returned.assign(returned, returned + n_returned);
    *chained_id = emlx::add_entry(std::move(made));
    return 0;
  });
}

int emlx_replay_set_group(int64_t id, const char* backend) {
  return emlx::guarded([&] {
    auto entry = emlx::find_entry(id);
    std::string name(backend);
    std::optional<mx::distributed::Group> group;
    if (!name.empty()) {
      if (!mx::distributed::is_available(name))
        throw std::invalid_argument("[replay] the " + name + " backend is not available");
      // Started already (by ea.distributed.init): MLX hands back its cached group at once.
      group = mx::distributed::init(false, name);
    }
    std::lock_guard lock(entry->mutex);
    entry->group = group;
    entry->grouped = true;
    entry->group_on_gpu = name == "nccl";
    return 0;
  });
}

void emlx_replay_end_chain(void) { emlx::end_chain(); }

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
