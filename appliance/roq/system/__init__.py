"""Operating-system helpers shared by every process: spawning, interfaces, sd_notify, /proc."""
