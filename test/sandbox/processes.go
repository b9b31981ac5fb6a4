package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// What the interrupt tests (test/sandbox, test/sandbox/cmd/demo) need to see which processes a
// sandbox started and whether they outlived it: read from /proc, Linux only.

// ChildProcesses returns the processes whose parent is pid.
func ChildProcesses(pid int) ([]int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range stats {
		if ppid, _, ok := parentAndState(f); ok && ppid == pid {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			out = append(out, child)
		}
	}
	return out, nil
}

// ProcessRunning reports whether pid is a process that has not exited (a zombie has: only its
// parent, init once the sandbox's process is gone, has not collected its status yet).
func ProcessRunning(pid int) bool {
	_, state, ok := parentAndState("/proc/" + strconv.Itoa(pid) + "/stat")
	return ok && state != "Z" && state != "X"
}

// ProcessCommand returns pid's command line, for messages.
func ProcessCommand(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
}

// parentAndState reads a /proc/<pid>/stat file: "pid (comm) state ppid ...", comm may hold spaces
// and parentheses.
func parentAndState(file string) (ppid int, state string, ok bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, "", false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(fields[1])
	return ppid, fields[0], err == nil
}
