#include "shared/records/trace_writer.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <tuple>

#include "shared/base/json_reader.hpp"

namespace tessera {

namespace {

const char* stream_name(StreamKind s) {
  switch (s) {
    case StreamKind::kCompute:
      return "compute";
    case StreamKind::kCollective:
      return "collective";
    case StreamKind::kP2p:
      return "p2p";
  }
  return "?";
}

// Receives occupy no stream in the Program; in the trace they sit on a fourth row so slices on
// one tid never overlap (Perfetto rejects overlap).
int tid_of(const Op& op) {
  return op.kind == OpKind::kRecv ? 3 : static_cast<int>(op.stream);
}

// Microseconds to the nanosecond: finer digits are noise and triple the file size.
double micros(double seconds) {
  return std::round(seconds * 1e9) / 1e3;
}

}  // namespace

std::string write_chrome_traces(const std::string& dir,
                                const std::vector<TraceIteration>& iterations,
                                const std::string& backend) {
  if (iterations.empty()) return "no iterations to trace";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return "cannot create " + dir + ": " + ec.message();
  const int32_t world = iterations.front().program->world;
  // Flow ids: one per send/receive pair, shared by both ranks' files.
  std::map<std::tuple<int64_t, int32_t, int32_t, int64_t>, int64_t> flow_ids;
  auto flow_id = [&](int64_t it, int32_t src, int32_t dst, int64_t tag) {
    const auto [pos, added] = flow_ids.emplace(std::make_tuple(it, src, dst, tag),
                                               static_cast<int64_t>(flow_ids.size()) + 1);
    return pos->second;
  };
  for (int32_t r = 0; r < world; ++r) {
    Json events = Json::array();
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    for (int tid = 0; tid < 4; ++tid)
      events.push_back(
          {{"name", "thread_name"},
           {"ph", "M"},
           {"pid", r},
           {"tid", tid},
           {"args", {{"name", tid == 3 ? "recv" : stream_name(static_cast<StreamKind>(tid))}}}});
    for (const TraceIteration& it : iterations) {
      const Program& p = *it.program;
      const Timeline& t = *it.timeline;
      const auto& ops = p.ranks[static_cast<std::size_t>(r)];
      double end = 0;
      for (const OpTime& o : t.ops[static_cast<std::size_t>(r)]) end = std::max(end, o.finish_s);
      events.push_back({{"name", "ProfilerStep#" + std::to_string(p.iteration)},
                        {"cat", "step"},
                        {"ph", "X"},
                        {"pid", r},
                        {"tid", 0},
                        {"ts", micros(it.offset_s)},
                        {"dur", micros(it.offset_s + t.step_s) - micros(it.offset_s)}});
      for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
        const Op& op = ops[static_cast<std::size_t>(i)];
        const OpTime& o = t.ops[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
        const bool comm = op.kind != OpKind::kCompute && op.kind != OpKind::kOptimizerStep;
        std::string name = op_name(p, op);
        if (comm) name = backend + ":" + name;
        Json args = {{"op_id", op_id(p, r, i)},
                     {"stage", op.stage},
                     {"chunk", op.chunk},
                     {"microbatch", op.microbatch},
                     {"phase", phase_name(op.phase)}};
        if (op.module >= 0) args["module"] = p.modules[static_cast<std::size_t>(op.module)];
        if (op.kind == OpKind::kCompute) {
          args["tokens"] = op.tokens;
          args["flops"] = op.flops;
        } else {
          args["bytes"] = op.kind == OpKind::kOptimizerStep ? op.memory_bytes : op.message_bytes;
        }
        const int tid = tid_of(op);
        // Receives from different peers may overlap in time; on their row they are marks at
        // arrival (zero length), so slices on one tid never overlap.
        const double start = op.kind == OpKind::kRecv ? o.finish_s : o.start_s;
        events.push_back({{"name", name},
                          {"cat", comm ? "comm" : "compute"},
                          {"ph", "X"},
                          {"pid", r},
                          {"tid", tid},
                          {"ts", micros(it.offset_s + start)},
                          {"dur", micros(it.offset_s + o.finish_s) - micros(it.offset_s + start)},
                          {"args", args}});
        if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
          const int32_t src = op.kind == OpKind::kSend ? r : op.peer;
          const int32_t dst = op.kind == OpKind::kSend ? op.peer : r;
          // The flow starts inside the send slice and ends inside the receive slice.
          events.push_back(
              {{"name", "p2p"},
               {"cat", "flow"},
               {"ph", op.kind == OpKind::kSend ? "s" : "f"},
               {"id", flow_id(p.iteration, src, dst, op.tag)},
               {"pid", r},
               {"tid", tid},
               {"ts", micros(it.offset_s + (op.kind == OpKind::kSend ? o.start_s : o.finish_s))},
               {"bp", "e"}});
        }
      }
      // Collectives measured inside compute ops, nested in their op's slice.
      if (static_cast<std::size_t>(r) < t.nested.size())
        for (const NestedSlice& n : t.nested[static_cast<std::size_t>(r)]) {
          const Op& op = ops[static_cast<std::size_t>(n.op)];
          events.push_back(
              {{"name", backend + ":" + collective_name(n.kind)},
               {"cat", "comm"},
               {"ph", "X"},
               {"pid", r},
               {"tid", tid_of(op)},
               {"ts", micros(it.offset_s + n.start_s)},
               {"dur", micros(it.offset_s + n.finish_s) - micros(it.offset_s + n.start_s)},
               {"args", {{"op_id", op_id(p, r, n.op)}, {"bytes", n.bytes}}}});
        }
    }
    Json doc = {{"traceEvents", events},
                {"displayTimeUnit", "ms"},
                {"distributedInfo", {{"rank", r}, {"world_size", world}, {"backend", backend}}}};
    const std::string file =
        (std::filesystem::path(dir) / ("rank" + std::to_string(r) + ".json")).string();
    const std::string problem = write_file_atomically(file, doc.dump());
    if (!problem.empty()) return problem;
  }
  return "";
}

}  // namespace tessera
