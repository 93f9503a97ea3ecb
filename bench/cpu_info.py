"""What every Python benchmark prints first: the CPU it ran on (bench/README: the CPU varies)."""


def cpu_model() -> str:
    """/proc/cpuinfo's model name, or "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"
