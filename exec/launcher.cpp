#include "exec/launcher.hpp"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tessera::exec {

namespace {

bool parse_int(const char* text, int& out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > 1 << 30) return false;
  out = static_cast<int>(value);
  return true;
}

struct Child {
  pid_t pid = -1;
  int rank = 0;
  int error_fd = -1;  // read end of the pipe the worker writes its error message to
  bool running = true;
  std::string error;
  int64_t error_at = 0;  // when the worker failed (steady clock ticks); 0: unknown
  int status = 0;
};

void drain(Child& c) {
  if (c.error_fd < 0) return;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(c.error_fd, buffer, sizeof buffer);
    if (n > 0) {
      c.error.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EOF or EAGAIN
  }
  // "<ticks>\n<message>": split off the time once the line is complete.
  if (c.error_at == 0)
    if (const auto newline = c.error.find('\n'); newline != std::string::npos) {
      try {
        c.error_at = std::stoll(c.error.substr(0, newline));
        c.error = c.error.substr(newline + 1);
      } catch (const std::exception&) {
      }
    }
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status))
    return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           ::strsignal(WTERMSIG(status)) + ")";
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

void stop_all(std::vector<Child>& children, double grace_s) {
  for (Child& c : children)
    if (c.running) ::kill(c.pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  for (;;) {
    bool any = false;
    for (Child& c : children) {
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) == c.pid)
        c.running = false;
      else
        any = true;
    }
    if (!any) return;
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Child& c : children) {
    if (!c.running) continue;
    ::kill(c.pid, SIGKILL);
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    c.running = false;
  }
}

}  // namespace

std::optional<WorkerEnv> worker_env_from_environment(std::string& problem) {
  // torchrun's names; else, inside an srun step of more than one task, Slurm's. (A batch script
  // itself has SLURM_PROCID 0 and the job's SLURM_NTASKS but no step: it is not a worker.)
  const char *rank_name = "RANK", *world_name = "WORLD_SIZE", *local_name = "LOCAL_RANK";
  if (std::getenv(rank_name) == nullptr && std::getenv(world_name) == nullptr) {
    int step_tasks = 0;
    if (!parse_int(std::getenv("SLURM_STEP_NUM_TASKS"), step_tasks) || step_tasks < 2)
      return std::nullopt;
    rank_name = "SLURM_PROCID";
    world_name = "SLURM_STEP_NUM_TASKS";
    local_name = "SLURM_LOCALID";
  }
  const std::string rank_var = rank_name, world_var = world_name, local_var = local_name;
  WorkerEnv env;
  if (!parse_int(std::getenv(rank_name), env.rank))
    problem = rank_var + " must be a non-negative integer";
  else if (!parse_int(std::getenv(world_name), env.world_size) || env.world_size < 1)
    problem = world_var + " must be a positive integer";
  else if (env.rank >= env.world_size)
    problem = rank_var + " must be < " + world_var;
  const char* local = std::getenv(local_name);
  env.local_rank = env.rank;
  if (local != nullptr && !parse_int(local, env.local_rank))
    problem = local_var + " must be a non-negative integer";
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0')
    env.master_addr = addr;
  const char* port = std::getenv("MASTER_PORT");
  if (port == nullptr || !parse_int(port, env.master_port) || env.master_port < 1 ||
      env.master_port > 65535)
    problem = problem.empty() ? "MASTER_PORT must be a port number when " + rank_var + " is set"
                              : problem;
  return env;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("cannot find a free port: ") + std::strerror(errno));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

LaunchResult launch(const LaunchOptions& options,
                    const std::function<int(const WorkerEnv&)>& worker) {
  LaunchResult result;
  if (options.nproc < 1 || options.nnodes < 1 || options.node_rank < 0 ||
      options.node_rank >= options.nnodes) {
    result.message = "invalid launch: nproc, nnodes >= 1 and 0 <= node_rank < nnodes";
    return result;
  }
  WorkerEnv base;
  base.world_size = options.nproc * options.nnodes;
  base.master_addr = options.master_addr;
  base.master_port = options.master_port;
  if (base.master_port == 0) {
    if (options.nnodes > 1) {
      result.message = "a multi-node job needs an explicit master port";
      return result;
    }
    base.master_port = free_port();
  }

  std::vector<Child> children;
  for (int local = 0; local < options.nproc; ++local) {
    int fds[2];
    if (::pipe(fds) != 0) {
      result.message = std::string("pipe: ") + std::strerror(errno);
      stop_all(children, options.stop_grace_s);
      return result;
    }
    WorkerEnv env = base;
    env.local_rank = local;
    env.rank = options.node_rank * options.nproc + local;
    const pid_t pid = ::fork();
    if (pid < 0) {
      result.message = std::string("fork: ") + std::strerror(errno);
      stop_all(children, options.stop_grace_s);
      return result;
    }
    if (pid == 0) {
      ::close(fds[0]);
      // Die with the launcher: a worker never outlives it as an orphan.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() == 1) ::_exit(1);  // the launcher died before prctl took effect
      int status = 1;
      std::string error;
      try {
        status = worker(env);
        if (status != 0) error = "worker returned " + std::to_string(status);
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown exception";
      }
      if (!error.empty()) {
        // When it failed (the monotonic clock all local processes share) comes first: peers
        // that fail because this one died report later, and the launcher names the root cause.
        error = std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n" +
                error;
        [[maybe_unused]] ssize_t ignored = ::write(fds[1], error.data(), error.size());
      }
      ::close(fds[1]);
      ::_exit(error.empty() ? 0 : (status == 0 ? 1 : status));
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    children.push_back({pid, env.rank, fds[0], true, "", 0, 0});
  }

  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options.timeout_s);
  int running = options.nproc;
  while (running > 0) {
    for (Child& c : children) {
      drain(c);
      if (!c.running) continue;
      int status = 0;
      const pid_t done = ::waitpid(c.pid, &status, WNOHANG);
      if (done != c.pid) continue;
      c.running = false;
      --running;
      drain(c);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
      // Give the others a moment to report too, then name the rank that failed first.
      c.status = status;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      Child* first = &c;
      for (Child& other : children) {
        drain(other);
        if (other.running && ::waitpid(other.pid, &other.status, WNOHANG) == other.pid)
          other.running = false;
        if (!other.running && other.error_at < first->error_at && other.error_at > 0)
          first = &other;
      }
      result.failed_rank = first->rank;
      result.message = "rank " + std::to_string(first->rank) + ": " +
                       (first->error.empty() ? describe_exit(first->status) : first->error);
      stop_all(children, options.stop_grace_s);
      for (Child& other : children) ::close(other.error_fd);
      return result;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      result.message = "timed out after " + std::to_string(options.timeout_s) + " s";
      stop_all(children, options.stop_grace_s);
      for (Child& other : children) ::close(other.error_fd);
      return result;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (Child& c : children) ::close(c.error_fd);
  result.ok = true;
  return result;
}

}  // namespace tessera::exec
