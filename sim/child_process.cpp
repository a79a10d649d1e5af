#include "sim/child_process.hpp"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

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

// A forked child being supervised: its result and error pipes, what they carried so far, and
// its deadline.
struct Running {
  std::size_t task = 0;
  pid_t pid = -1;
  int fds[2] = {-1, -1};  // result, error
  std::string output, error_text;
  std::chrono::steady_clock::time_point deadline;
  bool timed_out = false;
  std::string failure;  // pipe or fork failed: no child runs
  bool open() const { return fds[0] >= 0 || fds[1] >= 0; }
};

Running start_child(const std::function<std::string()>& body, double timeout_s) {
  Running r;
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) {
    r.failure = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  // Buffered output would otherwise be written twice: by the parent and by the child.
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    r.failure = std::string("fork: ") + std::strerror(errno);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    return r;
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
  r.pid = pid;
  r.fds[0] = out_pipe[0];
  r.fds[1] = err_pipe[0];
  r.deadline = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 1e9));
  return r;
}

// Reads what is ready on the children's pipes, waiting at most until the nearest deadline (and
// 1 s); a child past its deadline is killed and its pipes closed.
void pump(std::vector<Running*>& children) {
  const auto now = std::chrono::steady_clock::now();
  auto wait = std::chrono::milliseconds(1000);
  std::vector<pollfd> fds;
  std::vector<std::pair<Running*, int>> owner;
  for (Running* c : children) {
    if (!c->open()) continue;
    if (now >= c->deadline) {
      c->timed_out = true;
      ::kill(c->pid, SIGKILL);
      for (int& fd : c->fds)
        if (fd >= 0) {
          ::close(fd);
          fd = -1;
        }
      continue;
    }
    wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(c->deadline - now) +
                              std::chrono::milliseconds(1));
    for (int i = 0; i < 2; ++i)
      if (c->fds[i] >= 0) {
        fds.push_back({c->fds[i], POLLIN, 0});
        owner.emplace_back(c, i);
      }
  }
  if (fds.empty()) return;
  const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  if (ready <= 0) return;  // a timeout, or EINTR: the next call looks again
  char buffer[65536];
  for (std::size_t k = 0; k < fds.size(); ++k) {
    if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    auto [c, i] = owner[k];
    const ssize_t n = ::read(fds[k].fd, buffer, sizeof buffer);
    if (n > 0) {
      (i == 0 ? c->output : c->error_text).append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      ::close(c->fds[i]);
      c->fds[i] = -1;
    }
  }
}

// Reaps a child whose pipes are closed and says how it ended.
ChildResult finish_child(Running& c, double timeout_s) {
  ChildResult result;
  if (!c.failure.empty()) {
    result.error = c.failure;
    return result;
  }
  result.output = std::move(c.output);
  result.timed_out = c.timed_out;
  int status = 0;
  while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
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
    result.error = c.error_text.empty() ? "exited with status " + std::to_string(result.exit_code)
                                        : c.error_text;
  }
  return result;
}

}  // namespace

ChildResult run_in_child(const std::function<std::string()>& body, double timeout_s) {
  Running c = start_child(body, timeout_s);
  std::vector<Running*> one{&c};
  while (c.open()) pump(one);
  return finish_child(c, timeout_s);
}

void run_children(const std::vector<std::function<std::string()>>& tasks, int jobs,
                  double timeout_s,
                  const std::function<void(std::size_t, const ChildResult&)>& done) {
  // One thread forks and supervises up to `jobs` children at once: forking from several threads
  // could hand a child a lock (the allocator's, say) that another thread held at that moment.
  std::vector<std::unique_ptr<Running>> running;
  std::size_t next = 0;
  while (next < tasks.size() || !running.empty()) {
    while (next < tasks.size() && static_cast<int>(running.size()) < std::max(1, jobs)) {
      running.push_back(std::make_unique<Running>(start_child(tasks[next], timeout_s)));
      running.back()->task = next++;
    }
    std::vector<Running*> view;
    for (const auto& c : running) view.push_back(c.get());
    pump(view);
    for (auto it = running.begin(); it != running.end();) {
      if ((*it)->open()) {
        ++it;
        continue;
      }
      const std::size_t task = (*it)->task;
      const ChildResult result = finish_child(**it, timeout_s);
      it = running.erase(it);
      done(task, result);
    }
  }
}

}  // namespace tessera::sim
