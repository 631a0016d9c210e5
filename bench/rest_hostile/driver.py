"""One round: the measurement groups (throughput, hostile, memory, drain) against one binary."""
from . import log, loadavg
from .attacks import drain_test, hostile, memory_test
from .server import Server, server_extra
from .throughput import check_infer, run_pa, run_wrk


def one_round(binary, args, workdir, tokens, bodies):
    res = {"binary": binary}
    extra = server_extra(binary, args)
    res["extra_flags"] = extra
    luas, jpath, bpath, qpath = bodies
    if "throughput" in args.groups:
        srv = Server(binary, workdir, tokens, extra, label="tput")
        res["ready_s"] = srv.ready_s
        st_json = check_infer(srv.http_port, jpath)
        with open(bpath, "rb") as f:
            hlen = f.read().index(b"}]}") + 3
        st_bin = check_infer(srv.http_port, bpath, hlen)
        res["sanity"] = {"json": st_json[0], "binary": st_bin[0]}
        if st_json[0] != 200 or st_bin[0] != 200:
            log(f"  sanity infer failed: {st_json} {st_bin}")
        log(f"  wrk json c{args.json_concurrency} (load {loadavg()})")
        for conc in args.json_concurrency:
            res[f"wrk_json_c{conc}"] = run_wrk(srv.http_port, luas["json"], conc, args.wrk_s,
                                               threads=min(2, conc), pid=srv.proc.pid)
        for conc in (8, 64):
            if "wrk" in args.binary_tools:
                log(f"  wrk binary c{conc}")
                res[f"wrk_binary_c{conc}"] = run_wrk(srv.http_port, luas["binary"], conc, args.wrk_s,
                                                     threads=2, pid=srv.proc.pid)
            if "pa" in args.binary_tools and args.perf_analyzer:
                log(f"  perf_analyzer binary c{conc}")
                res[f"pa_binary_c{conc}"] = run_pa(args.perf_analyzer, srv.http_port, qpath, conc, workdir,
                                                       args.pa_stability)
        res["tput_alive"] = srv.alive()
        srv.stop()
    if "hostile" in args.groups:
        res["hostile"] = {}
        for mode in args.modes:  # a fresh server per attack: baselines are not inflated by the last
            srv = Server(binary, workdir, tokens, extra, label=f"hostile-{mode}")
            res["hostile"][mode] = hostile(srv, mode, args, workdir)
            h = res["hostile"][mode]
            h["stop_s_rc"] = srv.stop()
            log(f"  {mode}: http {h['http_answered']}/20 grpc {h['grpc_answered']}/20 "
                f"rss {h['rss_base_mib']:.0f}->{h['rss_peak_mib']:.0f} MiB thr {h['threads_peak']} "
                f"fds {h['fds_peak']} {h['slowhttptest']['verdict']}")
    if "memory" in args.groups:
        res["memory"] = {}
        for which in ("request_line_512MiB", "header_lines_256MiB"):
            log(f"  memory {which}")
            res["memory"][which] = memory_test(binary, workdir, tokens, which, extra)
    if "drain" in args.groups:
        log("  drain")
        res["drain"] = drain_test(binary, workdir, tokens, extra, args)
    return res
