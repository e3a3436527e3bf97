// Schedules as values: what each transformation does to the program, the lowered plan's structure
// (what an emitter walks), Schedule::str()'s text, the enumerated names of the four workloads, and
// TANDEM_DEBUG_IR's pass printing.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>

#include "schedule/testing.h"
#include "tandem/dsl/dsl.h"
#include "tandem/schedule/transforms.h"

namespace tandem::schedule {
namespace {

using namespace tandem::dsl;  // NOLINT: the builder's vocabulary

// SGD with a bf16 gradient: the smallest program with every kind of stage a schedule moves.
Program sgd() {
  Program p("sgd");
  const Expr lr = p.scalar("lr");
  const Expr g = p.input(BF16, {"N"}, Local, "g");
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  const Expr gs = AllReduce(Sum, g).named("gs");
  const Expr gf = cast(gs, F32).named("gf");
  const Expr step = (lr * gf).named("step");
  update(w, (w - step).named("w_new")).named("w1");
  return p;
}

using testing::names_of;

const NamedSchedule& find(const std::vector<NamedSchedule>& all, const std::string& name) {
  for (const NamedSchedule& ns : all)
    if (ns.name == name) return ns;
  throw std::runtime_error("no schedule " + name);
}

std::vector<const Step*> steps_of(const Plan& plan, StepKind kind) {
  std::vector<const Step*> out;
  std::function<void(const Step&)> walk = [&](const Step& s) {
    if (s.kind == kind) out.push_back(&s);
    for (const Step& b : s.pipeline.body) walk(b);
  };
  for (const Step& s : plan.steps) walk(s);
  return out;
}

// ---------------------------------------------------------------------------- transformations

TEST(Split, AllReduceBecomesReduceScatterAndAllGather) {
  Schedule s(sgd());
  const auto [rs, ag] = s.split("gs");
  const Program& p = s.program();
  EXPECT_EQ(p.stage_str(rs), "gs.rs = reduce_scatter.sum(g) dim=0 : bf16[N] Sliced(0)");
  EXPECT_EQ(p.stage_str(ag), "gs.ag = allgather(gs.rs) : bf16[N] Replicated");
  EXPECT_EQ(p.stage(*p.find("gf")).args[0], ag)
      << "every use of the AllReduce now uses the AllGather";
  EXPECT_FALSE(p.find("gs"));
  EXPECT_EQ(s.history(), std::vector<std::string>{"split(gs)"});
}

TEST(Reorder, ConsumersRunOnTheSliceAndResultsAreGathered) {
  Schedule s(sgd());
  const auto [rs, ag] = s.split("gs");
  const std::vector<int> made = s.reorder(ag, {"w1"});
  const Program& p = s.program();
  ASSERT_EQ(made.size(), 1u);
  EXPECT_EQ(p.stage_str(made[0]), "w_new.ag = allgather(w_new) : f32[N] Replicated");
  EXPECT_EQ(p.stage_str(*p.find("gf")), "gf = cast(gs.rs) : f32[N] Sliced(0)");
  EXPECT_EQ(p.stage_str(*p.find("w.slice")), "w.slice = scatter(w) dim=0 : f32[N] Sliced(0)")
      << "the Replicated operand is scattered";
  EXPECT_EQ(p.stage_str(*p.find("w1")), "w1 = update(w, w_new.ag) : f32[N] Replicated");
  EXPECT_FALSE(p.find("gs.ag")) << "the gather nobody reads any more is gone";
  (void)rs;
}

TEST(Reorder, SideComputationsMoveToo) {
  // beta1 * m only feeds the moved update: it runs on the slice as well, so no full-size work
  // remains in the update.
  Schedule s(workloads::adam());
  s.split("g_sum");
  s.reorder("g_sum.ag", {"m1", "v1", "w1"});
  const Program& p = s.program();
  for (const Stage& st : p.stages()) {
    if (op_kind(st.op) != OpKind::Elementwise || st.type.shape.rank() == 0) continue;
    EXPECT_TRUE(st.type.layout.is_sliced())
        << p.stage_str(st.id) << " still runs on the whole tensor";
  }
}

TEST(AsSlice, StoresTheInputSlicedAndDropsItsGather) {
  Schedule s(workloads::adam());
  s.split("g_sum");
  s.reorder("g_sum.ag", {"m1", "v1", "w1"});
  ASSERT_TRUE(s.program().find("m1.ag"));
  s.as_slice("m");
  const Program& p = s.program();
  EXPECT_EQ(p.stage_str(*p.find("m")), "m = input : f32[N] Sliced(0)");
  EXPECT_FALSE(p.find("m1.ag"));
  EXPECT_FALSE(p.find("m.slice"));
  EXPECT_EQ(p.stage(*p.find("m1")).type.layout, Layout::sliced(0));
  EXPECT_TRUE(p.find("v1.ag")) << "v is untouched";
}

TEST(DeadStages, UnusedStagesGoInputsStay) {
  Program p("dead");
  const Expr x = p.input(F32, {"N"}, Replicated, "x");
  const Expr unused = p.input(F32, {"N"}, Replicated, "unused");
  (x * 3.0).named("dead");
  p.output((x + 1.0).named("y"), "y");
  (void)unused;
  Schedule s(p);
  s.eliminate_dead_stages();
  EXPECT_FALSE(s.program().find("dead"));
  EXPECT_TRUE(s.program().find("unused"));
  EXPECT_TRUE(s.program().find("y"));
}

TEST(Fuse, ClosureTakesPathsAndSideComputations) {
  Schedule s(workloads::adam());
  const int f = s.fuse({"g_sum", "w1"});
  const FusedStage& fs = s.fused()[static_cast<size_t>(f)];
  const Program& p = s.program();
  EXPECT_EQ(fs.collective, *p.find("g_sum"));
  std::set<std::string> names;
  for (int id : fs.stages) names.insert(p.display_name(id));
  for (const char* n : {"g1", "m1", "v1", "mhat", "vhat", "r", "w1"})
    EXPECT_TRUE(names.count(n)) << n;
  // beta1 * m, an operand used only inside, joins; the scalar bias corrections stay out.
  const int m = *p.find("m");
  EXPECT_TRUE(std::any_of(fs.stages.begin(), fs.stages.end(), [&](int id) {
    return p.stage(id).op == Op::Mul && p.stage(id).args[1] == m;
  }));
  EXPECT_FALSE(names.count("bc1"));
}

// ------------------------------------------------------------------------- the lowered plan

TEST(Plan, FusedAllReduceCarriesTheEpilogue) {
  const auto all = enumerate_schedules(workloads::megatron_layer());
  const Plan plan = find(all, "fused(AR-C)").schedule.lower();
  const auto colls = steps_of(plan, StepKind::Collective);
  ASSERT_EQ(colls.size(), 1u) << "the carried result needs no gather of its own";
  const Collective& c = colls[0]->collective;
  EXPECT_EQ(c.op, Op::AllReduce);
  ASSERT_TRUE(c.fused);
  EXPECT_EQ(c.fused->domain, Domain::Chunk);
  EXPECT_EQ(plan.program.display_name(c.carry), "out");
  EXPECT_TRUE(c.in_place) << "the AllReduce works in the matmul's buffer";
  EXPECT_EQ(plan.values[static_cast<size_t>(c.carry)].alias, c.operand);
  EXPECT_EQ(c.fused->stores, std::vector<int>{c.carry});
}

TEST(Plan, FusedAllReduceGathersWhatItsHookComputed) {
  const auto all = enumerate_schedules(workloads::adam());
  const Plan plan = find(all, "fused(AR-C)").schedule.lower();
  const auto colls = steps_of(plan, StepKind::Collective);
  ASSERT_EQ(colls.size(), 4u);
  std::vector<std::string> completed;
  for (size_t i = 1; i < colls.size(); ++i) {
    EXPECT_EQ(colls[i]->collective.operand, -1);
    EXPECT_EQ(colls[i]->collective.partition, Partition::Flat);
    completed.push_back(plan.program.display_name(colls[i]->collective.stage));
  }
  EXPECT_EQ(completed, (std::vector<std::string>{"m1", "v1", "w1"}));
}

TEST(Plan, SlicedStateIsStoredSliced) {
  const auto all = enumerate_schedules(workloads::adam());
  const Plan plan = find(all, "fused(RS-C-AG)+slice(m,v)").schedule.lower();
  const Program& p = plan.program;
  EXPECT_EQ(plan.values[static_cast<size_t>(*p.find("m"))].storage, Storage::Slice);
  EXPECT_EQ(plan.values[static_cast<size_t>(*p.find("v"))].storage, Storage::Slice);
  EXPECT_EQ(plan.values[static_cast<size_t>(*p.find("w"))].storage, Storage::Full);
  EXPECT_TRUE(plan.values[static_cast<size_t>(*p.find("m"))].state);
  const auto colls = steps_of(plan, StepKind::Collective);
  ASSERT_EQ(colls.size(), 2u)
      << "one ReduceScatter with the update inside, one AllGather of the weights";
  EXPECT_EQ(colls[0]->collective.op, Op::ReduceScatter);
  EXPECT_EQ(colls[1]->collective.op, Op::AllGather);
  EXPECT_TRUE(colls[1]->collective.in_place);
  EXPECT_TRUE(steps_of(plan, StepKind::Loop).size() == 1u)
      << "only the scalar prelude is a loop of its own";
}

TEST(Plan, OverlapBecomesAPipelinePerGroup) {
  const auto all = enumerate_schedules(workloads::pipeline_stage());
  const Plan plan = find(all, "ol(MM,fused(RS-C)-P2P)-AG").schedule.lower();
  const auto pipes = steps_of(plan, StepKind::Pipeline);
  ASSERT_EQ(pipes.size(), 2u);
  EXPECT_EQ(pipes[0]->group, 0);
  EXPECT_EQ(pipes[1]->group, 1);
  EXPECT_EQ(pipes[0]->pipeline.blocks, 4);
  std::vector<StepKind> body0, body1;
  for (const Step& b : pipes[0]->pipeline.body) body0.push_back(b.kind);
  for (const Step& b : pipes[1]->pipeline.body) body1.push_back(b.kind);
  EXPECT_EQ(body0, (std::vector<StepKind>{StepKind::Matmul, StepKind::Collective,
                                          StepKind::Collective, StepKind::Send}));
  EXPECT_EQ(body1, (std::vector<StepKind>{StepKind::Recv, StepKind::Collective}));
  // The slice made inside the pipeline lives one block at a time.
  EXPECT_EQ(plan.values[static_cast<size_t>(*plan.program.find("out"))].storage, Storage::Block);
}

TEST(Plan, StrReadsAsTheSchedule) {
  Schedule s(sgd());
  const auto [rs, ag] = s.split("gs");
  const std::vector<int> gathers = s.reorder(ag, {"w1"});
  s.fuse({rs, "gf", "step", "w_new", gathers[0]});
  s.set_name("fused(RS-C-AG)");
  EXPECT_EQ(s.str(),
            "plan fused(RS-C-AG) of program sgd\n"
            "steps:\n"
            "   0. <fused stage 0> reduce_scatter.sum g -> gs.rs (dim 0 partition)\n"
            "        fused: on each reduced chunk of [N]\n"
            "          gf = cast(gs.rs) : f32[N] Sliced(0)   (register)\n"
            "          step = mul(lr, gf) : f32[N] Sliced(0)   (register)\n"
            "          w_new = sub(w.slice, step) : f32[N] Sliced(0)\n"
            "   1. <fused stage 0> allgather w_new -> w_new.ag (dim 0 partition) in place\n"
            "stored per rank:\n"
            "  lr             f32[] Replicated           full         (scalar)\n"
            "  g              bf16[N] Local              full         (input)\n"
            "  w              f32[N] Replicated          full         (input, updated in place)\n"
            "  gs.rs          bf16[N] Sliced(0)          slice (1/p) \n"
            "  w.slice        f32[N] Sliced(0)           slice (1/p)  (in w's buffer)\n"
            "  w_new          f32[N] Sliced(0)           slice (1/p)  (in w's buffer)\n"
            "  w_new.ag       f32[N] Replicated          full         (in w's buffer)\n"
            "  w1             f32[N] Replicated          full         (in w's buffer)\n");
}

TEST(Plan, UnscheduledRunsStageByStage) {
  const Plan plan = Schedule(sgd()).lower();
  std::vector<StepKind> kinds;
  for (const Step& s : plan.steps) kinds.push_back(s.kind);
  EXPECT_EQ(kinds, (std::vector<StepKind>{StepKind::Collective, StepKind::Loop, StepKind::Loop,
                                          StepKind::Loop}));
  EXPECT_EQ(plan.name, "unscheduled");
}

// -------------------------------------------------------------------------------- enumeration

TEST(Enumerate, OptimizerNames) {
  const std::vector<std::string> want{"AR-C",
                                      "AR-fused(C)",
                                      "fused(AR-C)",
                                      "RS-AG-C",
                                      "RS-AG-fused(C)",
                                      "RS-C-AG",
                                      "RS-fused(C)-AG",
                                      "fused(RS-C-AG)",
                                      "RS-C-AG+slice(m,v)",
                                      "RS-fused(C)-AG+slice(m,v)",
                                      "fused(RS-C-AG)+slice(m,v)"};
  EXPECT_EQ(names_of(enumerate_schedules(workloads::adam())), want);
  EXPECT_EQ(names_of(enumerate_schedules(workloads::lamb())), want);
}

TEST(Enumerate, MegatronNames) {
  EXPECT_EQ(names_of(enumerate_schedules(workloads::megatron_layer())),
            (std::vector<std::string>{
                "AR-C", "ol(MM,AR-C)", "AR-fused(C)", "ol(MM,AR-fused(C))", "fused(AR-C)",
                "ol(MM,fused(AR-C))", "RS-AG-C", "ol(MM,RS-AG-C)", "RS-AG-fused(C)",
                "ol(MM,RS-AG-fused(C))", "RS-C-AG", "ol(MM,RS-C-AG)", "RS-fused(C)-AG",
                "ol(MM,RS-fused(C)-AG)", "fused(RS-C-AG)", "ol(MM,fused(RS-C-AG))"}));
}

TEST(Enumerate, PipelineHasTheOverlappedAndSliceSendVariants) {
  const auto names = names_of(enumerate_schedules(workloads::pipeline_stage()));
  EXPECT_EQ(names.size(), 41u);
  for (const char* n : {"AR-C", "fused(AR-C)", "RS-C-AG", "fused(RS-C-AG)", "ol(MM,fused(AR-C))",
                        "ol(fused(AR-C),P2P)", "ol(MM,fused(AR-C),P2P)", "RS-C-P2P-AG",
                        "fused(RS-C)-P2P-AG", "ol(MM,fused(RS-C)-P2P)-AG"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

TEST(Enumerate, NamesAreUniqueAndPlansDistinct) {
  for (std::string_view w : workloads::names()) {
    const auto all = enumerate_schedules(workloads::by_name(w));
    std::set<std::string> names, plans;
    for (const NamedSchedule& ns : all) {
      EXPECT_TRUE(names.insert(ns.name).second) << w << ": " << ns.name << " twice";
      std::string text = ns.schedule.lower().str();
      text.erase(0, text.find('\n'));
      EXPECT_TRUE(plans.insert(text).second) << w << ": " << ns.name << " repeats another plan";
      EXPECT_EQ(ns.schedule.lower().name, ns.name);
    }
    // The program as written first (gather_weights has no AllReduce to schedule).
    const bool collectives = !recipe_collectives(workloads::by_name(w)).empty();
    EXPECT_EQ(all.front().name, collectives ? "AR-C" : "C") << w;
  }
}

TEST(Enumerate, StateTheCallerChooses) {
  EnumerateOptions o;
  o.state = std::vector<std::string>{"w", "m", "v"};
  const auto names = names_of(enumerate_schedules(workloads::adam(), o));
  EXPECT_EQ(names.back(), "fused(RS-C-AG)+slice(w,m,v)");
  o.state = std::vector<std::string>{};
  for (const std::string& n : names_of(enumerate_schedules(workloads::adam(), o)))
    EXPECT_EQ(n.find("slice"), std::string::npos) << n;
}

TEST(Enumerate, ProgramWithoutCollectives) {
  Program p("axpy");
  const Expr a = p.scalar("a");
  const Expr x = p.input(F32, {"N"}, Replicated, "x");
  const Expr y = p.input(F32, {"N"}, Replicated, "y");
  p.output((a * x + y).named("z"), "z");
  EXPECT_EQ(names_of(enumerate_schedules(p)), (std::vector<std::string>{"C", "fused(C)"}));
}

// ----------------------------------------------------------------------------- TANDEM_DEBUG_IR

TEST(DebugIr, PrintsTheProgramAfterEveryPass) {
  set_debug_ir(1);
  ::testing::internal::CaptureStderr();
  Schedule s(sgd());
  s.split("gs");
  s.lower();
  const std::string err = ::testing::internal::GetCapturedStderr();
  set_debug_ir(-1);
  EXPECT_NE(err.find("tandem ir: after split(gs) ("), std::string::npos) << err;
  EXPECT_NE(err.find(" us)\nprogram sgd\n"), std::string::npos) << err;
  EXPECT_NE(err.find("gs.rs = reduce_scatter.sum(g)"), std::string::npos);
  for (const char* pass : {"lower: units", "lower: order", "lower: storage", "lower: steps"})
    EXPECT_NE(err.find(std::string("tandem ir: after ") + pass), std::string::npos) << pass;
}

}  // namespace
}  // namespace tandem::schedule
