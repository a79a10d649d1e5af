#include "shared/records/run_record.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "shared/base/check.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/stage_split.hpp"

namespace tessera {

namespace fs = std::filesystem;

std::optional<RunRecord> load_run(const std::string& dir, Diagnostics& diag) {
  const std::string file = (fs::path(dir) / "run.json").string();
  const std::optional<Json> json = read_json_file(file, diag);
  if (!json) return std::nullopt;
  const std::size_t before = diag.errors().size();
  RunRecord run;
  run.dir = dir;
  if (!json->is_object() || !json->contains("scenario")) {
    diag.error(file, "scenario", "required key is missing (is this a tessera-train run folder?)");
    return std::nullopt;
  }
  std::optional<Scenario> scenario = read_scenario(json->at("scenario"), file, diag);
  if (!scenario) return std::nullopt;
  if (!scenario->plan) {
    diag.error(file, "scenario.plan", "required key is missing");
    return std::nullopt;
  }
  run.scenario = std::move(*scenario);
  ObjectReader r(*json, file, "", diag);
  for (const char* key : {"scenario", "scenario_file", "plan", "world", "device", "precision",
                          "backend", "dataset", "options", "software", "parameter_bytes_rank0",
                          "memory_per_rank", "first_step", "dip_search", "p2p_messages_reordered"})
    r.has(key);
  if (const Json* m = r.find("machine")) {
    ObjectReader mr(*m, file, "machine", diag);
    if (mr.required("cores", run.cores)) mr.check_positive("cores", run.cores);
    mr.optional("cpu", run.cpu);
    mr.has("gpu");
    mr.finish();
  } else {
    r.missing("machine");
  }
  const Json* its = r.find("iterations");
  if (its == nullptr || !its->is_array() || its->empty()) {
    r.error("iterations", "expected a non-empty array of the run's iterations");
  } else {
    for (std::size_t i = 0; i < its->size(); ++i) {
      ObjectReader ir((*its)[i], file, index_path("iterations", i), diag);
      if (!ir.valid()) continue;
      RecordedIteration it;
      ir.required("iteration", it.batch.iteration);
      if (ir.required("step_s", it.step_s)) ir.check_positive("step_s", it.step_s);
      for (const char* key : {"loss", "grad_norm", "llm_tokens", "model_flops"}) ir.has(key);
      const Json* samples = ir.find("samples");
      if (samples == nullptr || !samples->is_array()) {
        ir.error("samples", "expected the iteration's samples (an array)");
      } else {
        for (std::size_t k = 0; k < samples->size(); ++k) {
          Sample s;
          if (read_sample((*samples)[k], file, index_path(ir.path_of("samples"), k), s, diag))
            it.batch.samples.push_back(std::move(s));
        }
        if (static_cast<int64_t>(it.batch.samples.size()) != run.scenario.workload.global_batch)
          ir.error("samples", "has " + std::to_string(it.batch.samples.size()) +
                                  " samples; the workload's global batch is " +
                                  std::to_string(run.scenario.workload.global_batch));
      }
      // schedule dip: the schedule the step ran, so a replay lowers the same Program.
      if (const Json* dip = ir.find("dip")) {
        if (!dip->is_object() || !dip->contains("schedule"))
          ir.error("dip", "expected an object with the step's schedule");
        else
          it.dip = read_dip_schedule(dip->at("schedule"), run.scenario.model, file,
                                     join_path(ir.path_of("dip"), "schedule"), diag);
        if (it.dip && run.scenario.plan)
          if (const std::string why =
                  dip_schedule_problem(*it.dip, run.scenario.model, run.scenario.plan->layout.pp,
                                       run.scenario.plan->layout.vpp);
              !why.empty())
            diag.error(file, join_path(ir.path_of("dip"), "schedule"), why);
      }
      ir.finish();
      run.iterations.push_back(std::move(it));
    }
  }
  r.finish();
  if (diag.errors().size() != before) return std::nullopt;
  if (run.scenario.cluster.kind == ClusterKind::kCpuLocal) run.scenario.cluster.cores = run.cores;
  // The frozen-aware stage boundaries the run chose (from the default costs), resolved once here
  // for every replay and trace check of the record.
  Scenario& s = run.scenario;
  s.plan = resolve_stage_split(*s.plan, s.model, s.workload, s.cluster);
  return run;
}

Program lower_recorded(const RunRecord& run, const RecordedIteration& iteration) {
  const Scenario& s = run.scenario;
  Lowered lowered = lower(s.model, s.cluster, *s.plan, s.workload, iteration.batch,
                          iteration.dip ? &*iteration.dip : nullptr);
  TESSERA_CHECK(lowered.error.empty(), lowered.error);
  return std::move(lowered.program);
}

namespace {

// "it<I>.r<R>.<index>" -> (I, R, index); false when it is not one.
bool parse_op_id(const std::string& id, int64_t& iteration, int64_t& rank, int64_t& index) {
  long long it = 0, r = 0, i = 0;
  int consumed = 0;
  if (std::sscanf(id.c_str(), "it%lld.r%lld.%lld%n", &it, &r, &i, &consumed) != 3 ||
      consumed != static_cast<int>(id.size()))
    return false;
  iteration = it;
  rank = r;
  index = i;
  return true;
}

// A trace event's string field; "" when it is absent or not a string (nlohmann's value() throws
// on a wrong type).
std::string text_field(const Json& event, const char* key) {
  const auto it = event.find(key);
  return it != event.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::optional<std::vector<TracedIteration>> load_traces(const RunRecord& run, Diagnostics& diag) {
  const std::size_t before = diag.errors().size();
  std::map<int64_t, const RecordedIteration*> recorded;
  for (const RecordedIteration& it : run.iterations) recorded[it.batch.iteration] = &it;
  std::map<int64_t, TracedIteration> traced;  // by iteration
  std::map<int64_t, std::vector<std::vector<char>>> seen;
  int32_t world = -1;
  for (int32_t rank = 0; world < 0 || rank < world; ++rank) {
    const std::string file =
        (fs::path(run.dir) / "trace" / ("rank" + std::to_string(rank) + ".json")).string();
    const std::optional<Json> json = read_json_file(file, diag);
    if (!json) return std::nullopt;
    if (!json->is_object() || !json->contains("traceEvents") ||
        !json->at("traceEvents").is_array()) {
      diag.error(file, "traceEvents",
                 "expected a Chrome trace (an object with a traceEvents array)");
      return std::nullopt;
    }
    const Json& events = json->at("traceEvents");
    std::map<int64_t, double> offset_us;  // iteration -> ProfilerStep start
    for (const Json& e : events)
      if (e.is_object() && text_field(e, "cat") == "step" && e.contains("ts") &&
          e["ts"].is_number()) {
        const std::string name = text_field(e, "name");
        long long it = 0;
        if (std::sscanf(name.c_str(), "ProfilerStep#%lld", &it) == 1)
          offset_us[it] = e["ts"].get<double>();
      }
    for (std::size_t k = 0; k < events.size(); ++k) {
      const Json& e = events[k];
      if (!e.is_object() || text_field(e, "ph") != "X" || !e.contains("args") ||
          !e["args"].is_object() || !e["args"].contains("op_id"))
        continue;
      const std::string path = index_path("traceEvents", k);
      const Json& args = e["args"];
      int64_t it = 0, r = 0, index = 0;
      if (!args["op_id"].is_string() ||
          !parse_op_id(args["op_id"].get<std::string>(), it, r, index)) {
        diag.error(file, path + ".args.op_id", "expected an op id \"it<I>.r<R>.<index>\"");
        continue;
      }
      if (r != rank) {
        diag.error(file, path + ".args.op_id",
                   "op id " + args["op_id"].get<std::string>() + " names rank " +
                       std::to_string(r) + " in rank " + std::to_string(rank) + "'s trace");
        continue;
      }
      if (!e.contains("ts") || !e["ts"].is_number() || !e.contains("dur") ||
          !e["dur"].is_number()) {
        diag.error(file, path, "a slice needs numeric ts and dur");
        continue;
      }
      const auto rec = recorded.find(it);
      const auto off = offset_us.find(it);
      if (rec == recorded.end() || off == offset_us.end()) {
        diag.error(
            file, path + ".args.op_id",
            "iteration " + std::to_string(it) +
                (rec == recorded.end() ? " is not in run.json" : " has no ProfilerStep slice"));
        continue;
      }
      auto [pos, added] = traced.try_emplace(it);
      TracedIteration& ti = pos->second;
      if (added) {
        ti.program = lower_recorded(run, *rec->second);
        ti.timeline.ops.resize(ti.program.ranks.size());
        ti.timeline.nested.resize(ti.program.ranks.size());
        for (std::size_t q = 0; q < ti.program.ranks.size(); ++q)
          ti.timeline.ops[q].resize(ti.program.ranks[q].size());
        seen[it].resize(ti.program.ranks.size());
        for (std::size_t q = 0; q < ti.program.ranks.size(); ++q)
          seen[it][q].assign(ti.program.ranks[q].size(), 0);
        ti.timeline.step_s = rec->second->step_s;
      }
      if (world < 0) world = ti.program.world;
      const auto& ops = ti.program.ranks[static_cast<std::size_t>(rank)];
      if (index < 0 || index >= static_cast<int64_t>(ops.size())) {
        diag.error(file, path + ".args.op_id",
                   "op id " + args["op_id"].get<std::string>() +
                       " does not exist: the recorded plan's rank " + std::to_string(rank) +
                       " has " + std::to_string(ops.size()) + " ops in iteration " +
                       std::to_string(it));
        continue;
      }
      const Op& op = ops[static_cast<std::size_t>(index)];
      const double start = (e["ts"].get<double>() - off->second) * 1e-6;
      const double finish = start + e["dur"].get<double>() * 1e-6;
      if (!std::isfinite(start) || !std::isfinite(finish) || finish < start) {
        diag.error(file, path,
                   "the slice's ts and dur do not give a time span (dur < 0, or out of range)");
        continue;
      }
      const std::string name = text_field(e, "name");
      if (!args.contains("phase")) {
        // A collective measured inside the op.
        CollectiveKind kind{};
        const auto colon = name.find(':');
        Diagnostics ignored;
        if (op.kind != OpKind::kCompute || colon == std::string::npos ||
            !read_enum(Json(name.substr(colon + 1)), file, path, kind, kCollectiveKinds, ignored)) {
          diag.error(file, path,
                     "\"" + name + "\" inside " + args["op_id"].get<std::string>() +
                         " is not a collective inside a compute op");
          continue;
        }
        ti.timeline.nested[static_cast<std::size_t>(rank)].push_back(
            {static_cast<int32_t>(index), kind, start, finish,
             args.contains("bytes") && args["bytes"].is_number() ? args["bytes"].get<double>()
                                                                 : 0.0});
        continue;
      }
      std::string expected = op_name(ti.program, op);
      const auto colon = name.find(':');
      const bool comm = op.kind != OpKind::kCompute && op.kind != OpKind::kOptimizerStep;
      if (!(comm ? colon != std::string::npos && name.substr(colon + 1) == expected
                 : name == expected)) {
        diag.error(file, path + ".name",
                   "\"" + name + "\" (" + args["op_id"].get<std::string>() +
                       ") is not the recorded plan's op there, \"" + expected +
                       "\": the trace does not match the plan in run.json");
        continue;
      }
      ti.timeline.ops[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)] = {start,
                                                                                          finish};
      seen[it][static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)] = 1;
    }
    if (world < 0) {
      diag.error(file, "traceEvents",
                 "no op slices (was the run traced? tessera-train --trace-steps)");
      return std::nullopt;
    }
  }
  for (const auto& [it, ranks] : seen)
    for (std::size_t r = 0; r < ranks.size(); ++r)
      for (std::size_t i = 0; i < ranks[r].size(); ++i)
        if (!ranks[r][i]) {
          diag.error(
              (fs::path(run.dir) / "trace" / ("rank" + std::to_string(r) + ".json")).string(),
              "traceEvents",
              "misses op " +
                  op_id(traced[it].program, static_cast<int32_t>(r), static_cast<int32_t>(i)) +
                  " (" + op_name(traced[it].program, traced[it].program.ranks[r][i]) + ")");
          break;
        }
  if (diag.errors().size() != before) return std::nullopt;
  std::vector<TracedIteration> out;
  for (auto& [it, t] : traced) {
    for (auto& nested : t.timeline.nested)
      std::sort(nested.begin(), nested.end(),
                [](const NestedSlice& a, const NestedSlice& b) { return a.start_s < b.start_s; });
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace tessera
