#include "runtime/timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace memc {
namespace {

const char* const kRoles[] = {"params", "master_weights", "optimizer_state", "grads", "activations", "workspace", "comm"};
const char* const kColors[] = {"#4e79a7", "#76b7b2", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#9c755f"};

int role_index(const std::string& role) {
  for (int i = 0; i < 7; ++i) {
    if (role == kRoles[i]) return i;
  }
  return 4;  // anything else counts with the activations
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

constexpr double kWidth = 1100, kHeight = 320, kLeft = 70, kTop = 20;

// Live bytes per role at each step: the stacked area, drawn as one polygon per role.
std::string stacked_chart(const TimelineInput& in, int steps, int64_t top, int* peak_step) {
  std::vector<std::vector<int64_t>> live(7, std::vector<int64_t>(steps, 0));
  for (const TimelineBuffer& b : in.buffers) {
    for (int t = std::max(0, b.start); t <= std::min(steps - 1, b.end); ++t) live[role_index(b.role)][t] += b.bytes;
  }
  std::vector<int64_t> total(steps, 0);
  *peak_step = 0;
  for (int t = 0; t < steps; ++t) {
    for (int r = 0; r < 7; ++r) total[t] += live[r][t];
    if (total[t] > total[*peak_step]) *peak_step = t;
  }
  auto x = [&](double t) { return kLeft + kWidth * t / std::max(steps, 1); };
  auto y = [&](double bytes) { return kTop + kHeight * (1.0 - bytes / static_cast<double>(std::max<int64_t>(top, 1))); };
  std::string svg = "<svg id=\"stacked\" width=\"" + num(kLeft + kWidth + 20) + "\" height=\"" + num(kTop + kHeight + 40) + "\">\n";
  std::vector<int64_t> base(steps, 0);
  for (int r = 0; r < 7; ++r) {
    bool any = false;
    for (int t = 0; t < steps && !any; ++t) any = live[r][t] > 0;
    if (!any) continue;
    std::string upper, lower;
    for (int t = 0; t < steps; ++t) {
      upper += num(x(t)) + "," + num(y(static_cast<double>(base[t] + live[r][t]))) + " " + num(x(t + 1)) + "," +
               num(y(static_cast<double>(base[t] + live[r][t]))) + " ";
    }
    for (int t = steps - 1; t >= 0; --t) {
      lower += num(x(t + 1)) + "," + num(y(static_cast<double>(base[t]))) + " " + num(x(t)) + "," + num(y(static_cast<double>(base[t]))) + " ";
    }
    svg += "<polygon class=\"role\" data-role=\"" + std::string(kRoles[r]) + "\" fill=\"" + kColors[r] + "\" points=\"" + upper + lower +
           "\"><title>" + kRoles[r] + "</title></polygon>\n";
    for (int t = 0; t < steps; ++t) base[t] += live[r][t];
  }
  // Per-step hover strips: the op and the live bytes by role at that step.
  for (int t = 0; t < steps; ++t) {
    std::string tip = "step " + std::to_string(t) + (t < static_cast<int>(in.steps.size()) ? ": " + in.steps[t] : "") + "\nlive " + mib(total[t]);
    for (int r = 0; r < 7; ++r) {
      if (live[r][t]) tip += "\n  " + std::string(kRoles[r]) + " " + mib(live[r][t]);
    }
    svg += "<rect class=\"step\" x=\"" + num(x(t)) + "\" y=\"" + num(kTop) + "\" width=\"" + num(std::max(kWidth / steps, 0.5)) +
           "\" height=\"" + num(kHeight) + "\" fill=\"transparent\"><title>" + escape(tip) + "</title></rect>\n";
  }
  const double peak_y = y(static_cast<double>(in.arena_bytes));
  svg += "<line id=\"peak\" x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + kWidth) + "\" y1=\"" + num(peak_y) + "\" y2=\"" + num(peak_y) +
         "\" stroke=\"#000\" stroke-dasharray=\"6 3\"/>\n";
  svg += "<text x=\"" + num(kLeft + 4) + "\" y=\"" + num(peak_y - 4) + "\" font-size=\"12\">planned peak " + mib(in.arena_bytes) + "</text>\n";
  svg += "<line id=\"peak-step\" x1=\"" + num(x(*peak_step + 0.5)) + "\" x2=\"" + num(x(*peak_step + 0.5)) + "\" y1=\"" + num(kTop) +
         "\" y2=\"" + num(kTop + kHeight) + "\" stroke=\"#000\" stroke-width=\"0.7\"/>\n";
  if (in.budget_bytes > 0 && in.budget_bytes <= top) {
    const double by = y(static_cast<double>(in.budget_bytes));
    svg += "<line id=\"budget\" x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + kWidth) + "\" y1=\"" + num(by) + "\" y2=\"" + num(by) +
           "\" stroke=\"#d00\"/><text x=\"" + num(kLeft + kWidth - 160) + "\" y=\"" + num(by - 4) + "\" font-size=\"12\" fill=\"#d00\">budget " +
           mib(in.budget_bytes) + "</text>\n";
  }
  svg += "<text x=\"4\" y=\"" + num(kTop + 10) + "\" font-size=\"11\">" + mib(top) + "</text><text x=\"4\" y=\"" + num(kTop + kHeight) +
         "\" font-size=\"11\">0</text><text x=\"" + num(kLeft) + "\" y=\"" + num(kTop + kHeight + 16) + "\" font-size=\"11\">schedule step → (" +
         std::to_string(steps) + " steps)</text>\n</svg>\n";
  return svg;
}

// The arena: x = schedule step, y = offset; one rectangle per buffer.
std::string arena_map(const TimelineInput& in, int steps, int64_t top) {
  auto x = [&](double t) { return kLeft + kWidth * t / std::max(steps, 1); };
  auto y = [&](double bytes) { return kTop + kHeight * (1.0 - bytes / static_cast<double>(std::max<int64_t>(top, 1))); };
  std::string svg = "<svg id=\"arena\" width=\"" + num(kLeft + kWidth + 20) + "\" height=\"" + num(kTop + kHeight + 40) + "\">\n";
  for (const TimelineBuffer& b : in.buffers) {
    const double y0 = y(static_cast<double>(b.offset + b.bytes)), y1 = y(static_cast<double>(b.offset));
    const std::string tip = b.name + "\n" + b.role + ", " + mib(b.bytes) + " (" + std::to_string(b.bytes) + " bytes) at offset " +
                            std::to_string(b.offset) + "\nlive steps " + std::to_string(b.start) + "–" + std::to_string(b.end);
    svg += "<rect class=\"buffer\" data-name=\"" + escape(b.name) + "\" data-role=\"" + escape(b.role) + "\" x=\"" + num(x(b.start)) + "\" y=\"" +
           num(y0) + "\" width=\"" + num(std::max(x(b.end + 1) - x(b.start), 0.5)) + "\" height=\"" + num(std::max(y1 - y0, 0.5)) + "\" fill=\"" +
           kColors[role_index(b.role)] + "\"><title>" + escape(tip) + "</title></rect>\n";
  }
  svg += "<text x=\"4\" y=\"" + num(kTop + 10) + "\" font-size=\"11\">" + mib(top) + "</text><text x=\"4\" y=\"" + num(kTop + kHeight) +
         "\" font-size=\"11\">offset 0</text></svg>\n";
  return svg;
}

}  // namespace

std::string render_timeline_html(const TimelineInput& in) {
  const int steps = std::max<int>(1, static_cast<int>(in.steps.size()));
  int64_t top = std::max(in.arena_bytes, in.lower_bound_bytes);
  for (const TimelineBuffer& b : in.buffers) top = std::max(top, b.offset + b.bytes);
  int peak_step = 0;
  const std::string stacked = stacked_chart(in, steps, top, &peak_step);
  std::string html = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + escape(in.title) +
                     "</title>\n<style>body{font-family:sans-serif;margin:16px}h1{font-size:18px}h2{font-size:15px;margin-top:24px}"
                     "rect.buffer:hover,rect.step:hover{stroke:#000;stroke-width:1}.legend span{display:inline-block;margin-right:14px}"
                     ".legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}</style></head><body>\n";
  html += "<h1>" + escape(in.title) + "</h1>\n<p id=\"summary\">planned peak <b>" + mib(in.arena_bytes) + "</b> (" +
          std::to_string(in.arena_bytes) + " bytes) · no-fragmentation lower bound " + mib(in.lower_bound_bytes) + " · " +
          std::to_string(in.buffers.size()) + " buffers · " + std::to_string(steps) + " steps · peak at step " + std::to_string(peak_step) +
          (peak_step < static_cast<int>(in.steps.size()) ? " (" + escape(in.steps[peak_step]) + ")" : "") +
          (in.budget_bytes > 0 ? " · budget " + mib(in.budget_bytes) : "") + "</p>\n<div class=\"legend\">";
  for (int r = 0; r < 7; ++r) html += std::string("<span><i style=\"background:") + kColors[r] + "\"></i>" + kRoles[r] + "</span>";
  html += "</div>\n<h2>Live memory by role</h2>\n" + stacked + "<h2>Arena: each buffer at its planned offset</h2>\n" + arena_map(in, steps, top);
  html += "</body></html>\n";
  return html;
}

}  // namespace memc
