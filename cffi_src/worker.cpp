#include <cxxabi.h>
#include <fcntl.h>
#ifdef __APPLE__
#include <mach/mach.h>
#else
#include <dirent.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <time.h>

#include "channel.hpp"
#include "ops.hpp"
#include "replay.hpp"
#include "validate.hpp"
#include "worker.hpp"
#include "mlx/device.h"
#include "mlx/stream.h"
#include "mlx/transforms.h"

namespace mx = mlx::core;

// emlx_python_job (declared in emlx_abi.h) is defined by the cffi module.

namespace {

enum class JobKind { Eval, Python, Synchronize, Stop, Op };

using emlx::OpCall;

// Records for the channel; payloads are std::vector<mx::array>*.
emlx_completion record(uint64_t id, int32_t status, int32_t kind = 0, char* message = nullptr,
                       std::vector<mx::array>* payload = nullptr,
                       int32_t payload_kind = EMLX_PAYLOAD_RESULTS) {
  return {id, status, kind, message, payload, payload_kind, 0, 0};
}

// The clock Python's time.monotonic_ns() reads (CLOCK_MONOTONIC on Linux,
// mach_absolute_time on macOS), so a job's submit time (taken in Python) and
// its start (taken here) can be subtracted.
uint64_t monotonic_ns() noexcept {
#ifdef __APPLE__
  return clock_gettime_nsec_np(CLOCK_UPTIME_RAW);
#else
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
#endif
}

struct Job {
  uint64_t id;
  JobKind kind;
  std::vector<mx::array> arrays;
  void* context = nullptr;
  std::shared_ptr<OpCall> op;  // JobKind::Op only
  // Op jobs: the caller's donated inputs (positions in `arrays`). Until the
  // graph has consumed them they are handed back on every path that does not
  // succeed, so the caller's arrays stay intact.
  std::vector<size_t> donated;
  // When the job reached the worker's queue (stamped by emlx_worker::submit):
  // how soon after the worker ran out of work it came decides the next spin.
  std::chrono::steady_clock::time_point queued_at{};

  std::vector<mx::array>* restore_payload() const {
    if (donated.empty() || arrays.empty()) return nullptr;
    auto* out = new std::vector<mx::array>();
    for (size_t i : donated) out->push_back(arrays[i]);
    return out;
  }
};

// Set by emlx_shutdown: from then on Python jobs are dropped, never called,
// because the interpreter may be finalizing.
std::atomic<bool> finalizing{false};

// Worker threads left detached inside a job (abandoned, or busy at shutdown)
// that have not ended yet: while any remains, exit() must not run MLX's C++
// static destructors under it (see exit_without_teardown).
std::atomic<int> detached_alive{0};

}  // namespace

struct emlx_worker {
  explicit emlx_worker(int device_type)
      : device_type(device_type),
        device(device_type == EMLX_DEVICE_GPU ? mx::Device::gpu : mx::Device::cpu) {}

  void start();
  void main();
  void run(Job& job);
  void run_op_job(Job& job);
  void spin_for_work();
  static std::chrono::microseconds spin_window();
  int submit(Job&& job);
  void post(const emlx_completion& r);
  void detach();

  const int device_type;
  const mx::Device device;
  std::thread thread;
  int tid = 0;
  int stream_index = -1;

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Job> jobs;
  // The runtime this worker is leased to (shared: it may close first).
  std::shared_ptr<emlx::Channel> channel;
  std::atomic<size_t> queued{0};    // jobs.size(), readable without the mutex while spinning
  unsigned spin_backoff = 0;        // parks to go without spinning (worker thread only)
  // Worker thread only: when it last ran out of work, and whether the job
  // that ended that idle spell came within the spin window (see spin_for_work).
  std::chrono::steady_clock::time_point idle_since{};
  bool idle = false;
  bool jobs_come_soon = true;
  unsigned spin_backoff_next = 0;   // the next backoff: doubles while spins keep being preempted
  bool stopping = false;            // a stop marker is queued: refuse new jobs
  bool exit = false;                // process shutdown: leave the loop
  bool started = false;
  bool finished = false;
  bool busy = false;                // running a job (under `mutex`): emlx_shutdown leaves it at once
  bool detached = false;            // counted in detached_alive until the thread ends (under `mutex`)
  // Abandoned inside a job (emlx_worker_abandon): when the job returns, the
  // worker parks instead of reporting (under `mutex`).
  bool retiring = false;
  // Abandoned: its lease ended with no stop marker, so the replay chain that lease
  // left on this thread is dropped before the next job (under `mutex`).
  bool stale_chain = false;
  bool chain_left = false;          // worker thread only: stale_chain, taken with a job
  std::string start_error;
  uint64_t job_started_ns = 0;      // the running job's start, stamped on its records (worker thread only)
};

namespace {

std::mutex registry_mutex;
std::vector<emlx_worker*> all_workers;  // never shrinks: MLX never frees a stream
std::vector<emlx_worker*> parked;
// Abandoned inside a job: neither leased nor parked until the job returns.
// Leaving them was a leak: MLX never frees a stream's thread, so each
// abandoned worker (every run that ended with a job in flight) kept one OS
// thread for good, while a new worker (and stream) was made for the next run.
std::vector<emlx_worker*> retiring_workers;

thread_local emlx_worker* this_worker = nullptr;  // set on a worker's own thread

// fork() copies the registry but none of the worker threads: in the child
// every registered worker is a ghost. Left registered, a new lease took a
// parked ghost (its jobs never ran) and the exit hook waited its whole
// timeout for ghosts to leave their loops (2 s per exit of any child of a
// parent that had started a runtime). The child forgets them: their objects
// are leaked on purpose (a std::thread that was never joined aborts in its
// destructor, and the parent's Python objects may still point at them).
// The registry lock is held across fork() so that the child's copy is never
// one a vanished thread held.
void lock_registry_for_fork() { registry_mutex.lock(); }
void unlock_registry_after_fork() { registry_mutex.unlock(); }
void forget_parent_workers() {
  all_workers.clear();
  parked.clear();
  retiring_workers.clear();
  detached_alive.store(0);  // the parent's detached threads do not run here either
  registry_mutex.unlock();
}

const int fork_handlers_installed =
    pthread_atfork(lock_registry_for_fork, unlock_registry_after_fork, forget_parent_workers);

}  // namespace

// Let the thread go on alone; until it ends it counts in detached_alive, so
// that process exit skips the C++ teardown it may still be running in.
void emlx_worker::detach() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!finished) {
      detached = true;
      detached_alive.fetch_add(1);
    }
  }
  thread.detach();
}

void emlx_worker::post(const emlx_completion& finished) {
  // Every record a worker posts for a job it ran carries the job's run time
  // (the runtime's per-queue counters; rt.stats()).
  emlx_completion r = finished;
  r.started_ns = job_started_ns;
  r.finished_ns = monotonic_ns();
  std::shared_ptr<emlx::Channel> target;
  {
    std::lock_guard<std::mutex> lock(mutex);
    target = channel;
  }
  if (target) {
    target->post(r);  // a closed channel frees the record
  } else {
    std::free(r.message);
    delete static_cast<std::vector<mx::array>*>(r.payload);
  }
}

namespace {

emlx_completion failure(uint64_t id, std::exception_ptr error, std::vector<mx::array>* payload = nullptr,
                        int32_t payload_kind = EMLX_PAYLOAD_RESTORE) {
  auto caught = emlx::classify(error);
  return record(id, EMLX_FAILED, caught.kind, emlx::copy_message(caught.message), payload, payload_kind);
}

}  // namespace

void emlx_worker::start() {
  thread = std::thread([this] { main(); });
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [this] { return started || finished; });
}

void emlx_worker::main() {
  {
    std::lock_guard<std::mutex> lock(mutex);
#ifdef __APPLE__
    pthread_setname_np("emlx-worker");
    uint64_t thread_id = 0;
    pthread_threadid_np(nullptr, &thread_id);
    tid = static_cast<int>(thread_id);
#else
    pthread_setname_np(pthread_self(), "emlx-worker");
    tid = static_cast<int>(syscall(SYS_gettid));
#endif
    try {
      // The stream must be made on this thread: MLX streams are thread-local.
      mx::Stream stream = mx::new_stream(device);
      mx::set_default_stream(stream);
      stream_index = stream.index;
      started = true;
    } catch (...) {
      start_error = emlx::classify(std::current_exception()).message;
      finished = true;
    }
  }
  cv.notify_all();
  if (!started) return;
  this_worker = this;
  // However the thread ends (its loop left, or CPython's pthread_exit
  // unwinding a Python job during finalization), it is no longer in MLX.
  struct Leaving {
    emlx_worker* worker;
    ~Leaving() {
      // Notified under the lock: a joining emlx_shutdown deletes the worker
      // as soon as it sees `finished`.
      std::lock_guard<std::mutex> lock(worker->mutex);
      worker->finished = true;
      if (worker->detached) detached_alive.fetch_sub(1);
      worker->cv.notify_all();
    }
  } leaving{this};

  for (;;) {
    Job job;
    spin_for_work();
    {
      std::unique_lock<std::mutex> lock(mutex, std::defer_lock);
      // A spinning worker sees a new job's count while the submitter still
      // holds the mutex; blocking there would make the submitter's unlock a futex wake.
      emlx::lock_briefly_contended(lock);
      cv.wait(lock, [this] { return exit || !jobs.empty(); });
      if (exit) break;
      job = std::move(jobs.front());
      jobs.pop_front();
      queued.store(jobs.size(), std::memory_order_relaxed);
      busy = true;
      chain_left = std::exchange(stale_chain, false);
    }
    if (chain_left) emlx::end_chain();  // an abandoned lease's, before the next holder's first job
    if (idle) {
      idle = false;
      jobs_come_soon = job.queued_at - idle_since <= spin_window();
    }
    job_started_ns = monotonic_ns();
    try {
      run(job);
    } catch (abi::__forced_unwind&) {
      // A detached worker inside a Python job when the interpreter finalizes:
      // CPython ends the thread (pthread_exit) as it asks for the GIL back.
      // That unwinding must go on; swallowing it would abort the process.
      throw;
    } catch (...) {
      // Only a failure to post (out of memory) gets here; an exception must
      // never end this thread, which std::terminate would turn into a crash.
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      busy = false;
      if (retiring) {
        // The abandoned job returned (its record was dropped; abandon
        // discarded the queued ones and submits are refused): back to the
        // pool, keeping the stream. Not once emlx_shutdown has taken the
        // registry (then this worker is no longer in retiring_workers).
        retiring = false;
        std::lock_guard<std::mutex> registry(registry_mutex);
        auto it = std::find(retiring_workers.begin(), retiring_workers.end(), this);
        if (it != retiring_workers.end()) {
          retiring_workers.erase(it);
          stopping = false;
          parked.push_back(this);
        }
      }
    }
  }
  mx::clear_streams();
}

void emlx_worker::run(Job& job) {
  switch (job.kind) {
    case JobKind::Eval:
    case JobKind::Synchronize:
      try {
        if (job.kind == JobKind::Eval) {
          emlx::validate::check_evaluable("eval", job.arrays);  // a failed allocation would end the process
          mx::eval(job.arrays);
        } else {
          mx::synchronize(mx::default_stream(device));
        }
        job.arrays.clear();  // drop graph references here, not on the loop
        post(record(job.id, EMLX_DONE));
      } catch (...) {
        job.arrays.clear();
        post(failure(job.id, std::current_exception()));
      }
      break;
    case JobKind::Op:
      run_op_job(job);
      break;
    case JobKind::Python:
      if (finalizing.load()) {
        post(record(job.id, EMLX_DROPPED));
      } else {
        int status = emlx_python_job(job.context, job.id);
        post(record(job.id, status));
      }
      break;
    case JobKind::Stop: {
      // The lease ends: a chain its holder left (a cancelled stream's caches) must
      // not reach the next holder, nor hold its memory while the worker parks.
      emlx::end_chain();
      std::shared_ptr<emlx::Channel> target;
      {
        std::lock_guard<std::mutex> lock(mutex);
        target.swap(channel);
        stopping = false;
      }
      {
        // Parked before the record goes out: whoever reads EMLX_STOPPED sees
        // the worker counted as parked (the leak checks rely on it). A new
        // lease may take it at once; this post still goes to the old channel.
        std::lock_guard<std::mutex> lock(registry_mutex);
        parked.push_back(this);
      }
      if (target) target->post(record(job.id, EMLX_STOPPED));
      break;
    }
  }
}

namespace {

bool cpus_to_spare();

// mx::eval of a small op's outputs, watching them for a moment before
// blocking. MLX runs the op's kernels on its stream thread and eval then
// waits on a condition variable: the stream thread's signal is one more
// futex wake (a thread hop, 5-6 us here) on every op's round trip. A tiny op
// is done within a few microseconds, so the worker polls the outputs first,
// yielding its CPU to other runnable threads (the stream thread among them),
// and blocks as before once the window has passed or CPUs are short.
void evaluate_watching(std::vector<mx::array>& outputs) {
  constexpr auto kWatch = std::chrono::microseconds(20);
  if (!cpus_to_spare()) return mx::eval(outputs);
  mx::async_eval(outputs);
  const auto until = std::chrono::steady_clock::now() + kWatch;
  auto all_available = [&] {
    for (auto& out : outputs)
      if (!out.is_available()) return false;
    return true;
  };
  while (!all_available() && std::chrono::steady_clock::now() < until) sched_yield();
  mx::eval(outputs);  // returns at once for available outputs; rethrows the stream's errors
}

}  // namespace

void emlx_worker::run_op_job(Job& job) {
  const OpCall& call = *job.op;
  std::vector<mx::array> outputs;
  try {
    outputs = emlx::run_op(call.op, device, job.arrays, call.ints.data(), call.ints.size(), call.floats.data(),
                           call.floats.size(), call.text);
  } catch (...) {
    // The graph was never built: the donated inputs go back to the caller.
    post(failure(job.id, std::current_exception(), job.restore_payload()));
    job.arrays.clear();
    return;
  }
  job.arrays.clear();  // from here the graph holds the only references
  try {
    if (call.evaluate) evaluate_watching(outputs);
  } catch (...) {
    post(failure(job.id, std::current_exception()));
    return;
  }
  auto* results = new std::vector<mx::array>(std::move(outputs));
  try {
    if (call.check_finite) emlx::check_finite(*results, "emlx op");
  } catch (...) {
    // Computed, but refused: the results still go back, so donated inputs
    // updated in place are published into the caller's arrays.
    post(failure(job.id, std::current_exception(), results, EMLX_PAYLOAD_RESULTS));
    return;
  }
  post(record(job.id, EMLX_DONE, 0, nullptr, results));
}

// Before parking on the condition variable, watch the queue for a short
// while: the loop's next submission often follows within tens of
// microseconds, and waking a parked thread costs 40-70 us on small VMs
// (DESIGN §7). EMLX_SPIN_US sets the window (0 turns it off).
//
// Spinning only pays while this thread has a CPU to itself. When the CPUs
// are oversubscribed (other processes runnable), a spinner is preempted
// mid-spin, and the scheduler's fairness then makes it, and the loop thread
// competing with it, wait longer for their next turn than a parked thread
// that is woken: measured with load average 10 on 2 cores, the empty job's
// round trip was 24-79 us with the spin against 18-29 us without it. A gap
// of over 200 us between two clock reads of the spin loop means the thread
// was descheduled (a time slice lost to another runnable thread); then the
// worker parks at once for the next 64 jobs, twice as many each time the next
// try is preempted too (up to 65536), half as many after a clean one. Shorter
// gaps are interrupts and the hypervisor's jitter, seen on idle VMs too: with
// a 20 us threshold one of them turned the spin off for the rest of a
// benchmark case, and the idle round trip swung between 12 and 90 us.
//
// A spinner that keeps its CPU can still hurt: when every CPU is busy, the
// loop thread woken by the worker's completion waits for the CPU the spinner
// holds. Measured at load average 3-5 on 2 cores (empty native job, p50):
// from the worker's post to the loop's drain 6 us parked against 10 us
// spinning, with the pick-up of the next job no faster (4 us both); a native
// 4x4 add 37 against 45 us. So on Linux the worker spins only while the
// kernel's count of runnable threads (/proc/loadavg, read at most every
// 10 ms) leaves a CPU for the loop thread.
namespace {

bool cpus_to_spare() {
#ifdef __linux__
  static const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  thread_local std::chrono::steady_clock::time_point checked{};
  thread_local bool spare = true;
  const auto now = std::chrono::steady_clock::now();
  if (now - checked < std::chrono::milliseconds(10)) return spare;
  checked = now;
  int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return spare = true;
  char text[128];
  ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return spare = true;
  text[n] = 0;
  // "0.50 0.40 0.30 2/345 6789": the fourth field is runnable/total, this thread included.
  const char* field = text;
  for (int spaces = 0; spaces < 3 && field != nullptr; ++spaces) {
    field = std::strchr(field, ' ');
    if (field != nullptr) ++field;
  }
  if (field == nullptr) return spare = true;
  const long runnable = std::strtol(field, nullptr, 10);
  spare = runnable < cpus + 1;  // this worker and the loop thread fit
  return spare;
#else
  return true;
#endif
}

}  // namespace

std::chrono::microseconds emlx_worker::spin_window() {
  static const std::chrono::microseconds window{[] {
    const char* text = std::getenv("EMLX_SPIN_US");
    long value = text ? std::strtol(text, nullptr, 10) : 50;
    return value < 0 ? 0 : std::min(value, 10000L);
  }()};
  return window;
}

// Only while jobs come soon: a worker whose last job arrived later than the
// window after it ran out of work (jobs spaced apart, an idle runtime)
// parks at once, since its spin would only have burnt the window; the first
// job that again follows within the window turns the spin back on. Measured
// (empty jobs, one queue, asyncio): jobs 200 us apart cost 99 us of process
// CPU each with the unconditional spin and 59 us without; back-to-back round
// trips, where the spin pays, are unchanged.
void emlx_worker::spin_for_work() {
  constexpr unsigned kMinBackoff = 64, kMaxBackoff = 65536;
  constexpr auto kPreempted = std::chrono::microseconds(200);
  if (queued.load(std::memory_order_acquire) != 0) return;
  auto now = std::chrono::steady_clock::now();
  idle_since = now;
  idle = true;
  if (spin_window().count() == 0 || !jobs_come_soon) return;
  if (!cpus_to_spare()) return;
  if (spin_backoff > 0) {
    --spin_backoff;
    return;
  }
  const auto until = now + spin_window();
  while (queued.load(std::memory_order_acquire) == 0) {
    // Yield rather than pause: with a CPU to itself the call returns at once
    // (well under a microsecond), and when other threads are runnable, the
    // loop thread among them, it lets them run instead of burning the slice
    // they wait for.
    sched_yield();
    const auto previous = now;
    now = std::chrono::steady_clock::now();
    if (now - previous > kPreempted) {
      spin_backoff = std::max(spin_backoff_next, kMinBackoff);
      spin_backoff_next = std::min(spin_backoff * 2, kMaxBackoff);
      return;
    }
    if (now >= until) break;
  }
  spin_backoff_next /= 2;  // a spin that kept its CPU
}

// ---- process exit with detached workers ----------------------------------
//
// A worker left inside a job at exit goes on running in MLX while the
// process ends, and two things then kill a process that was exiting cleanly
// with SIGABRT ("terminate called without an active exception"):
// - exit() runs MLX's C++ static destructors (and the shared libraries'
//   finalizers) under it;
// - a Python job returning from an MLX call (mx.eval releases the GIL) after
//   finalization began is ended by CPython with pthread_exit, whose unwinding
//   meets a noexcept frame in the binding: std::terminate.
// So emlx_shutdown (the interpreter's exit hook) arms both guards below.
namespace {

std::terminate_handler previous_terminate = nullptr;

// A detached worker being ended by the exiting interpreter has nothing left
// to do: it sleeps until the process is gone instead of aborting it.
[[noreturn]] void terminate_quietly_at_exit() {
  if (this_worker != nullptr && finalizing.load()) {
    for (;;) pause();
  }
  if (previous_terminate != nullptr) previous_terminate();
  std::abort();
}

#ifdef __GLIBC__
// Registered during the interpreter's finalization, so it runs before every
// exit handler registered earlier (C++ static destructors included), and
// after Python has run its atexit handlers and flushed sys.stdout/stderr.
// glibc's on_exit hands it the status exit() was given.
void exit_without_teardown(int status, void*) {
  if (detached_alive.load() == 0) return;  // nothing runs in MLX: the normal teardown
  std::fflush(nullptr);
  _exit(status);
}
#endif

void guard_process_exit() {
  static std::once_flag once;
  std::call_once(once, [] {
    previous_terminate = std::set_terminate(terminate_quietly_at_exit);
#ifdef __GLIBC__
    on_exit(exit_without_teardown, nullptr);
#endif
    // Elsewhere (no on_exit) exit() keeps its teardown: skipping it would
    // lose the exit status.
  });
}

}  // namespace

int emlx_worker::submit(Job&& job) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping || exit || channel == nullptr) {
      emlx::set_last_error("[emlx] the queue's worker is stopping", EMLX_ERR_CLOSED);
      return -1;
    }
    job.queued_at = std::chrono::steady_clock::now();
    jobs.push_back(std::move(job));
    queued.store(jobs.size(), std::memory_order_release);
  }
  cv.notify_one();
  return 0;
}

namespace emlx {

bool usable_on(const emlx_worker* worker, const mx::array& a) {
  if (a.status() != mx::array::Status::unscheduled || !a.has_primitive()) return true;
  const mx::Stream& s = a.primitive().stream();
  return s.device == worker->device && s.index == worker->stream_index;
}

int submit_op_job(emlx_worker* worker, uint64_t job_id, std::shared_ptr<OpCall> call,
                  std::vector<mx::array>& arrays, std::vector<size_t> donated) {
  Job job{job_id, JobKind::Op, std::move(arrays), nullptr, std::move(call)};
  job.donated = std::move(donated);
  int status = worker->submit(std::move(job));
  if (status != 0) arrays = std::move(job.arrays);  // not queued (job was not moved): the caller keeps them
  return status;
}

}  // namespace emlx

namespace {

// Under worker->mutex: a released or abandoned worker takes no second stop.
bool already_released(emlx_worker* worker) {
  if (!worker->stopping && worker->channel != nullptr) return false;
  emlx::set_last_error("[emlx] the worker is already released", EMLX_ERR_CLOSED);
  return true;
}

}  // namespace

extern "C" {

emlx_worker* emlx_worker_acquire(emlx_channel* channel, int device_type) {
  emlx_worker* worker = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = std::find_if(parked.begin(), parked.end(),
                           [&](emlx_worker* w) { return w->device_type == device_type; });
    if (it != parked.end()) {
      worker = *it;
      parked.erase(it);
    }
  }
  if (worker == nullptr) {
    try {
      worker = new emlx_worker(device_type);
      worker->start();
    } catch (...) {
      emlx::set_last_error(emlx::classify(std::current_exception()));
      delete worker;
      return nullptr;
    }
    if (!worker->started) {
      emlx::set_last_error(worker->start_error);
      worker->thread.join();
      delete worker;
      return nullptr;
    }
    try {
      std::lock_guard<std::mutex> lock(registry_mutex);
      all_workers.push_back(worker);
    } catch (...) {
      emlx::set_last_error("[emlx] out of memory registering a worker");
      return nullptr;  // the thread stays alive but unreachable; nothing is freed twice
    }
  }
  std::lock_guard<std::mutex> lock(worker->mutex);
  worker->channel = channel->impl;
  return worker;
}

int emlx_worker_release(emlx_worker* worker, uint64_t job_id, int drop_pending) {
  return emlx::guarded([&] {
    std::deque<Job> dropped;
    std::shared_ptr<emlx::Channel> target;
    {
      std::lock_guard<std::mutex> lock(worker->mutex);
      if (already_released(worker)) return -1;
      worker->jobs.push_back(Job{job_id, JobKind::Stop, {}, nullptr});
      if (drop_pending) {
        dropped.swap(worker->jobs);
        worker->jobs.push_back(std::move(dropped.back()));  // keep the stop marker
        dropped.pop_back();
      }
      worker->queued.store(worker->jobs.size(), std::memory_order_release);
      worker->stopping = true;
      target = worker->channel;
    }
    worker->cv.notify_one();
    for (auto& job : dropped) target->post(record(job.id, EMLX_DROPPED, 0, nullptr, job.restore_payload(),
                                                  EMLX_PAYLOAD_RESTORE));
    return 0;
  });
}

int emlx_worker_abandon(emlx_worker* worker) {
  return emlx::guarded([&] {
    std::deque<Job> discarded;
    {
      std::lock_guard<std::mutex> lock(worker->mutex);
      if (already_released(worker)) return -1;
      discarded.swap(worker->jobs);
      worker->queued.store(0, std::memory_order_release);
      worker->channel.reset();  // the running job's record is freed, never posted
      worker->stale_chain = true;  // no stop marker runs: the next lease's first job drops the chain
      // The worker stays registered (emlx_shutdown leaves it at once while
      // its job runs, so exit does not wait for it), but leased to no one.
      // Idle (only queued jobs, now discarded), it parks at once; inside a
      // job, it parks when the job returns (emlx_worker::main). Either way
      // its stream is reused: MLX never frees a stream's thread.
      std::lock_guard<std::mutex> registry(registry_mutex);
      if (worker->busy) {
        worker->stopping = true;  // refuse jobs until it parks
        worker->retiring = true;
        retiring_workers.push_back(worker);
      } else {
        parked.push_back(worker);
      }
    }
    return 0;
    // `discarded` (graph references of jobs that never ran) is destroyed here, outside the locks.
  });
}

int emlx_worker_retiring(emlx_worker* worker) {
  std::lock_guard<std::mutex> lock(worker->mutex);
  return worker->retiring ? 1 : 0;
}

int emlx_worker_stream_index(emlx_worker* worker) { return worker->stream_index; }
int emlx_worker_thread_id(emlx_worker* worker) { return worker->tid; }

int emlx_submit_eval(emlx_worker* worker, uint64_t job_id, const intptr_t* arrays, size_t count,
                     int check_ready) {
  return emlx::guarded([&] {
    Job job{job_id, JobKind::Eval, {}, nullptr};
    job.arrays.reserve(count);
    {
      emlx::GilGuard gil;  // handles can be swapped by in-place ops on other threads
      for (size_t i = 0; i < count; ++i) {
        job.arrays.push_back(emlx::array_of(reinterpret_cast<void*>(arrays[i])));
        if (check_ready && !emlx::usable_on(worker, job.arrays.back())) return 1;
      }
    }
    return worker->submit(std::move(job));
  });
}

int emlx_submit_python(emlx_worker* worker, uint64_t job_id, void* context) {
  return emlx::guarded([&] { return worker->submit(Job{job_id, JobKind::Python, {}, context}); });
}

int emlx_submit_synchronize(emlx_worker* worker, uint64_t job_id) {
  return emlx::guarded([&] { return worker->submit(Job{job_id, JobKind::Synchronize, {}, nullptr}); });
}

int emlx_cancel(emlx_worker* worker, uint64_t job_id, void** restored) {
  *restored = nullptr;
  return emlx::guarded([&] {
    Job removed{0, JobKind::Stop, {}, nullptr, nullptr};
    {
      std::lock_guard<std::mutex> lock(worker->mutex);
      auto it = std::find_if(worker->jobs.begin(), worker->jobs.end(), [&](const Job& j) {
        return j.id == job_id && j.kind != JobKind::Stop;
      });
      if (it == worker->jobs.end()) return 0;
      removed = std::move(*it);
      worker->jobs.erase(it);
      worker->queued.store(worker->jobs.size(), std::memory_order_relaxed);
    }
    *restored = removed.restore_payload();
    // `removed` (and its graph references) is destroyed here, outside the lock.
    return 1;
  });
}

int emlx_mlx_stream_threads(void) {
  // Read without the scheduler's lock: in a fork child (the one caller that
  // matters) a lock held by a vanished parent thread would never be freed,
  // and only the forking thread exists there. The child inherits the map but
  // not its threads.
  return static_cast<int>(emlx::mlx_internals::stream_threads());
}

int emlx_process_thread_ids(uint64_t* out, int capacity) {
  int count = 0;
#ifdef __APPLE__
  // The ids pthread_threadid_np gives (Python's threading.get_native_id).
  thread_act_array_t threads = nullptr;
  mach_msg_type_number_t n = 0;
  if (task_threads(mach_task_self(), &threads, &n) != KERN_SUCCESS) return -1;
  for (mach_msg_type_number_t i = 0; i < n; ++i) {
    thread_identifier_info_data_t info{};
    mach_msg_type_number_t size = THREAD_IDENTIFIER_INFO_COUNT;
    bool known = thread_info(threads[i], THREAD_IDENTIFIER_INFO, reinterpret_cast<thread_info_t>(&info), &size) ==
                 KERN_SUCCESS;
    if (count < capacity) out[count] = known ? info.thread_id : 0;  // 0: a thread, id unknown
    ++count;
    mach_port_deallocate(mach_task_self(), threads[i]);
  }
  vm_deallocate(mach_task_self(), reinterpret_cast<vm_address_t>(threads), n * sizeof(thread_act_t));
#else
  // Kernel thread ids (Python's threading.get_native_id).
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    if (count < capacity) out[count] = std::strtoull(entry->d_name, nullptr, 10);
    ++count;
  }
  closedir(dir);
#endif
  return count;
}

int emlx_workers_active(void) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return static_cast<int>(all_workers.size() - parked.size() - retiring_workers.size());
}

int emlx_workers_parked(void) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return static_cast<int>(parked.size());
}

int emlx_shutdown(int timeout_ms) {
  finalizing.store(true);
  guard_process_exit();
  std::vector<emlx_worker*> workers;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    workers.swap(all_workers);
    parked.clear();
    retiring_workers.clear();  // a retiring worker is in `workers`: left below if still in its job
  }
  // A worker running a job is left at once, as a daemon thread is: its job
  // (Python or native) is abandoned and its result dropped, and exit does
  // not wait for it. Workers between jobs leave their loop and are joined.
  std::vector<bool> running(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    auto* w = workers[i];
    {
      std::lock_guard<std::mutex> lock(w->mutex);
      w->exit = true;
      running[i] = w->busy;
    }
    w->cv.notify_all();
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int left_behind = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    auto* w = workers[i];
    bool done = false;
    if (!running[i]) {
      std::unique_lock<std::mutex> lock(w->mutex);
      done = w->cv.wait_until(lock, deadline, [w] { return w->finished; });
    }
    if (done) {
      w->thread.join();
      delete w;
    } else {
      // Inside a job: leave it so exit never waits. The object is leaked on
      // purpose; the thread still uses it until the process ends.
      w->detach();
      ++left_behind;
    }
  }
  return left_behind;
}

}  // extern "C"
