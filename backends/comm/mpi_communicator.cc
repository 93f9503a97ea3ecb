#include "backends/comm/mpi_communicator.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace memc::comm {

struct MpiCommunicator::Pending {
  MPI_Request request = MPI_REQUEST_NULL;
  const char* op = "";
};

namespace {

// ---- 16-bit float reductions: f32 arithmetic, rounded to nearest even per addition ----------

template <typename T, bool kMax>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = load<T>(a[i]), y = load<T>(b[i]);
    // max propagates NaN from either side, so an overflow flag survives the reduction.
    b[i] = store<T, float>(kMax ? ((x != x || x > y) ? x : y) : x + y);
  }
}

// MPI_MAX drops a NaN that arrives as its first operand; this max keeps it.
template <typename T>
void max_keeping_nan(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = (a[i] != a[i] || a[i] > b[i]) ? a[i] : b[i];
}

Expected<MPI_Datatype> mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kF16:
    case DType::kBF16: return MPI_UINT16_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kBool:
    case DType::kU8: return MPI_UINT8_T;
  }
  return Status::BadInput("unknown dtype");
}

std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return str_cat("MPI error ", rc);
  return std::string(text, length);
}

Status check_count(const char* op, int64_t count) {
  if (count < 0 || count > INT_MAX) return Status::BadInput(str_cat(op, ": count ", count, " outside [0, 2^31) elements"));
  return Status::Ok();
}

// ---- The SIGTERM report: async-signal-safe (write, kill, open, read), state fixed at create ---

struct FailureReport {
  int rank = 0, size = 1;
  const int* pids = nullptr;        // per rank
  const bool* same_host = nullptr;  // per rank
  const char* volatile current_op = nullptr;
};
FailureReport g_report;

// Appends text to a fixed buffer without allocating.
struct Line {
  char text[512];
  size_t length = 0;
  void add(const char* s) {
    while (*s && length + 1 < sizeof(text)) text[length++] = *s++;
  }
  void add(long v) {
    char digits[24];
    int n = 0;
    const bool negative = v < 0;
    unsigned long u = negative ? 0ul - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
    do digits[n++] = static_cast<char>('0' + u % 10); while ((u /= 10) && n < 23);
    if (negative) digits[n++] = '-';
    while (n && length + 1 < sizeof(text)) text[length++] = digits[--n];
  }
};

// A process that no longer exists, or a zombie its launcher has not reaped yet.
bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) == -1 && errno == ESRCH) return true;
  Line path;
  path.add("/proc/");
  path.add(static_cast<long>(pid));
  path.add("/stat");
  path.text[path.length] = '\0';
  const int fd = open(path.text, O_RDONLY);
  if (fd < 0) return false;
  char stat[512];
  const ssize_t got = read(fd, stat, sizeof(stat) - 1);
  close(fd);
  if (got <= 0) return false;
  // "pid (comm) S ...": the state follows the last ')'.
  for (ssize_t i = got - 1; i > 0; --i) {
    if (stat[i] == ')') return i + 2 < got && (stat[i + 2] == 'Z' || stat[i + 2] == 'X');
  }
  return false;
}

// Appends "rank 1 (pid 4242), rank 3 (pid 4244)" for the peers on this host that are gone.
int add_dead_peers(Line& line) {
  int found = 0;
  for (int r = 0; r < g_report.size; ++r) {
    if (r == g_report.rank || !g_report.same_host[r] || !process_gone(g_report.pids[r])) continue;
    line.add(found++ ? ", rank " : "rank ");
    line.add(static_cast<long>(r));
    line.add(" (pid ");
    line.add(static_cast<long>(g_report.pids[r]));
    line.add(")");
  }
  return found;
}

extern "C" void on_terminate(int) {
  Line line;
  line.add("memc: rank ");
  line.add(static_cast<long>(g_report.rank));
  line.add(" of ");
  line.add(static_cast<long>(g_report.size));
  line.add(": stopped by the launcher");
  const char* op = g_report.current_op;
  if (op) {
    line.add(" during ");
    line.add(op);
  }
  const size_t before = line.length;
  line.add(": ");
  if (const int gone = add_dead_peers(line); gone > 0) {
    line.add(gone == 1 ? " is gone" : " are gone");
  } else {
    line.length = before;
    line.add(": a peer rank failed (mpirun names it)");
  }
  line.add("\n");
  ssize_t ignored = write(STDERR_FILENO, line.text, line.length);
  (void)ignored;
  // mpirun signals every survivor at once; staying a moment lets the others look before this
  // one is gone too, so each names only the rank that died first (mpirun's SIGKILL follows
  // after about a second).
  const timespec linger = {0, 300'000'000};
  nanosleep(&linger, nullptr);
  _exit(1);
}

// Marks the collective in progress for the report; cleared when it completes.
struct CurrentOp {
  explicit CurrentOp(const char* op) { g_report.current_op = op; }
  ~CurrentOp() { g_report.current_op = nullptr; }
};

}  // namespace

Expected<std::unique_ptr<MpiCommunicator>> MpiCommunicator::create(Options options) {
  std::unique_ptr<MpiCommunicator> comm(new MpiCommunicator());
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) return Status::Internal("MPI was finalized in this process and cannot be initialized again");
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      return Status::Internal("MPI_Init_thread failed");
    }
    comm->finalize_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &comm->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &comm->size_);

  comm->timeout_s_ = options.timeout_s;
  if (comm->timeout_s_ <= 0) {
    const char* env = std::getenv("MEMC_COMM_TIMEOUT_S");
    comm->timeout_s_ = env && std::atof(env) > 0 ? std::atof(env) : 600;
  }

  // Who runs where: pids and host names, so a failure can name the peer that is gone.
  const int size = comm->size_;
  comm->pids_.assign(size, 0);
  const int pid = static_cast<int>(getpid());
  int rc = MPI_Allgather(&pid, 1, MPI_INT, comm->pids_.data(), 1, MPI_INT, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) return Status::Internal(str_cat("MPI_Allgather of pids: ", mpi_error(rc)));
  std::vector<char> hosts(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME, '\0');
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_length = 0;
  MPI_Get_processor_name(host, &host_length);
  rc = MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) return Status::Internal(str_cat("MPI_Allgather of host names: ", mpi_error(rc)));
  comm->same_host_.assign(size, false);
  for (int r = 0; r < size; ++r) {
    comm->same_host_[r] = std::strncmp(&hosts[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME], host, MPI_MAX_PROCESSOR_NAME) == 0;
  }

  MPI_Op* ops = reinterpret_cast<MPI_Op*>(comm->user_ops_);
  static_assert(sizeof(MPI_Op) <= sizeof(void*));
  MPI_Op_create(&reduce16<bf16_t, false>, 1, &ops[0]);
  MPI_Op_create(&reduce16<bf16_t, true>, 1, &ops[1]);
  MPI_Op_create(&reduce16<f16_t, false>, 1, &ops[2]);
  MPI_Op_create(&reduce16<f16_t, true>, 1, &ops[3]);
  ops[4] = MPI_SUM;
  MPI_Op_create(&max_keeping_nan<float>, 1, &ops[5]);
  ops[6] = MPI_SUM;
  MPI_Op_create(&max_keeping_nan<double>, 1, &ops[7]);

  if (options.report_peer_failure) {
    // Leaked on purpose: the handler may run until the process ends.
    static std::vector<int> pids;
    static std::unique_ptr<bool[]> same_host;
    pids = comm->pids_;
    same_host.reset(new bool[size]);
    for (int r = 0; r < size; ++r) same_host[r] = comm->same_host_[r];
    g_report.rank = comm->rank_;
    g_report.size = size;
    g_report.pids = pids.data();
    g_report.same_host = same_host.get();
    struct sigaction action = {};
    action.sa_handler = on_terminate;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, nullptr);
  }
  return comm;
}

MpiCommunicator::~MpiCommunicator() {
  MPI_Op* ops = reinterpret_cast<MPI_Op*>(user_ops_);
  for (int i : {0, 1, 2, 3, 5, 7}) {
    if (ops[i] != MPI_OP_NULL && ops[i] != 0) MPI_Op_free(&ops[i]);
  }
  if (finalize_) MPI_Finalize();
}

Status MpiCommunicator::failure(const char* op, const std::string& why) const {
  const std::string dead = dead_peers();
  return Status::Internal(str_cat("rank ", rank_, " of ", size_, ": ", op, " ", why, dead.empty() ? "" : "; gone: " + dead));
}

std::string MpiCommunicator::dead_peers() const {
  std::string out;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !same_host_[r] || !process_gone(pids_[r])) continue;
    out += str_cat(out.empty() ? "" : ", ", "rank ", r, " (pid ", pids_[r], ")");
  }
  return out;
}

Expected<RequestId> MpiCommunicator::track(const char* op, int rc, void* request) {
  if (rc != MPI_SUCCESS) return failure(op, str_cat("failed to start: ", mpi_error(rc)));
  auto pending = std::make_unique<Pending>();
  pending->request = *static_cast<MPI_Request*>(request);
  pending->op = op;
  const RequestId id = next_request_++;
  pending_[id] = std::move(pending);
  return id;
}

namespace {

// The MPI op for a reduction of `dtype`, or a bad-input status for dtypes that do not reduce.
// user_ops: [bf16, f16, f32, f64][sum, max] (f32/f64 sums are MPI_SUM).
Expected<MPI_Op> reduce_op(void* const user_ops[4][2], DType dtype, ReduceOp op) {
  const int which = op == ReduceOp::kSum ? 0 : 1;
  switch (dtype) {
    case DType::kI32:
    case DType::kI64: return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
    case DType::kBF16: return reinterpret_cast<MPI_Op const*>(user_ops[0])[which];
    case DType::kF16: return reinterpret_cast<MPI_Op const*>(user_ops[1])[which];
    case DType::kF32: return reinterpret_cast<MPI_Op const*>(user_ops[2])[which];
    case DType::kF64: return reinterpret_cast<MPI_Op const*>(user_ops[3])[which];
    default: return Status::BadInput(str_cat("cannot reduce ", dtype_name(dtype), " (float, i32 or i64 only)"));
  }
}

}  // namespace

Expected<RequestId> MpiCommunicator::start_all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  MEMC_RETURN_IF_ERROR(check_count("all_gather", count));
  auto type = mpi_type(dtype);
  if (!type.ok()) return type.status();
  MPI_Request request;
  const int rc = MPI_Iallgather(send, static_cast<int>(count), *type, recv, static_cast<int>(count), *type, MPI_COMM_WORLD, &request);
  return track("all_gather", rc, &request);
}

Expected<RequestId> MpiCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  MEMC_RETURN_IF_ERROR(check_count("reduce_scatter", count));
  auto type = mpi_type(dtype);
  auto mpi_op = reduce_op(user_ops_, dtype, op);
  if (!type.ok()) return type.status();
  if (!mpi_op.ok()) return mpi_op.status().with_context("reduce_scatter: ");
  MPI_Request request;
  const int rc = MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), *type, *mpi_op, MPI_COMM_WORLD, &request);
  return track("reduce_scatter", rc, &request);
}

Expected<RequestId> MpiCommunicator::start_all_reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) {
  MEMC_RETURN_IF_ERROR(check_count("all_reduce", count));
  auto type = mpi_type(dtype);
  auto mpi_op = reduce_op(user_ops_, dtype, op);
  if (!type.ok()) return type.status();
  if (!mpi_op.ok()) return mpi_op.status().with_context("all_reduce: ");
  MPI_Request request;
  const int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), *type, *mpi_op, MPI_COMM_WORLD, &request);
  return track("all_reduce", rc, &request);
}

Expected<RequestId> MpiCommunicator::start_broadcast(void* buffer, int64_t count, DType dtype, int root) {
  MEMC_RETURN_IF_ERROR(check_count("broadcast", count));
  if (root < 0 || root >= size_) return Status::BadInput(str_cat("broadcast: root ", root, " is not a rank of ", size_));
  auto type = mpi_type(dtype);
  if (!type.ok()) return type.status();
  MPI_Request request;
  const int rc = MPI_Ibcast(buffer, static_cast<int>(count), *type, root, MPI_COMM_WORLD, &request);
  return track("broadcast", rc, &request);
}

Status MpiCommunicator::wait(RequestId id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return Status::Internal(str_cat("rank ", rank_, ": wait for unknown request ", id));
  std::unique_ptr<Pending> pending = std::move(it->second);
  pending_.erase(it);
  CurrentOp current(pending->op);
  // Poll rather than MPI_Wait, so a peer that never joins cannot hang this rank.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int rc = MPI_Test(&pending->request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return failure(pending->op, str_cat("failed: ", mpi_error(rc)));
    if (done) return Status::Ok();
    if ((polls & 1023) == 1023 && std::chrono::steady_clock::now() > deadline) {
      return failure(pending->op, str_cat("did not complete within ", timeout_s_, " s"));
    }
    if (polls > 64) sched_yield();
  }
}

Status MpiCommunicator::barrier() {
  MPI_Request request;
  auto id = track("barrier", MPI_Ibarrier(MPI_COMM_WORLD, &request), &request);
  return id.ok() ? wait(*id) : id.status();
}

void MpiCommunicator::abort(int exit_code) {
  // This rank has said why it stops; the launcher's SIGTERM need not be reported again.
  signal(SIGTERM, SIG_DFL);
  // Nor need Open MPI's page about MPI_ABORT (help-mpi-api.txt / mpi-abort), which would otherwise
  // surround the one line the user should read: its runtime's quiet switch (the MCA parameter
  // orte_execute_quiet), set now, when nothing but that page is left to say. Absent elsewhere.
  if (auto* quiet = static_cast<bool*>(dlsym(RTLD_DEFAULT, "orte_execute_quiet"))) *quiet = true;
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace memc::comm
