#include "sim/child_process.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace tessera::sim {

namespace {

void write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

ChildResult run_in_child(const std::function<std::string()>& body, double timeout_s) {
  ChildResult result;
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) {
    result.error = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  // Buffered output would otherwise be written twice: by the parent and by the child.
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    result.error = std::string("fork: ") + std::strerror(errno);
    return result;
  }
  if (pid == 0) {
    // A crash in the child must end it plainly (the parent reports it), not run handlers it
    // inherited (a test framework's, say).
    for (int sig : {SIGSEGV, SIGABRT, SIGFPE, SIGILL, SIGBUS, SIGTERM, SIGINT})
      std::signal(sig, SIG_DFL);
    // A killed parent (a sweep stopped with kill -9) takes its simulations with it: no orphans.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the parent died before prctl took effect
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    int status = 0;
    try {
      write_all(out_pipe[1], body());
    } catch (const std::exception& e) {
      write_all(err_pipe[1], e.what());
      status = 1;
    } catch (...) {
      write_all(err_pipe[1], "unknown exception");
      status = 1;
    }
    ::_exit(status);  // no atexit handlers, no flushing of the parent's buffers twice
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);

  // Drain both pipes until the child closes them or the deadline passes.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 1e9);
  std::string error_text;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  char buffer[65536];
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        (i == 0 ? result.output : error_text).append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (const pollfd& p : fds)
    if (p.fd >= 0) ::close(p.fd);

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
    result.ok = result.exit_code == 0 && !result.timed_out;
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  if (result.timed_out) {
    result.error = "timed out after " + std::to_string(timeout_s) + " s";
  } else if (result.signal != 0) {
    result.error = std::string("killed by signal ") + std::to_string(result.signal) + " (" +
                   ::strsignal(result.signal) + ")";
  } else if (!result.ok) {
    result.error =
        error_text.empty() ? "exited with status " + std::to_string(result.exit_code) : error_text;
  }
  return result;
}

void run_children(const std::vector<std::function<std::string()>>& tasks, int jobs,
                  double timeout_s,
                  const std::function<void(std::size_t, const ChildResult&)>& done) {
  // Each pool thread forks and supervises one child at a time; children never share memory.
  std::atomic<std::size_t> next{0};
  std::mutex report;
  auto worker = [&] {
    for (std::size_t i = next++; i < tasks.size(); i = next++) {
      const ChildResult result = run_in_child(tasks[i], timeout_s);
      const std::lock_guard lock(report);
      done(i, result);
    }
  };
  std::vector<std::thread> pool;
  for (int j = 0; j < std::max(1, jobs); ++j) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
}

}  // namespace tessera::sim
