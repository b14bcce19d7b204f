// Command testsummary reads `go test -json` on stdin and prints what `go test` without -v
// prints (the output of failing tests, each package's closing ok/FAIL line), then the
// slowest tests of the run. `make test` pipes through it, so CI's log shows where the
// minutes go (docs/testing.md, "Time in tests").
//
//	go test -json ./... | go run ./hack/testsummary [-top 10]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type timing struct {
	name    string
	elapsed float64
}

func main() {
	top := flag.Int("top", 10, "how many of the slowest tests to list")
	flag.Parse()
	failed, err := run(os.Stdin, os.Stdout, *top)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// closing reports whether o is a passing package's closing line (a failing package's comes
// with the rest of its output when it fails).
func closing(o string) bool {
	for _, p := range []string{"ok  \t", "?   \t"} {
		if strings.HasPrefix(o, p) {
			return true
		}
	}
	return false
}

// run copies the run's output as plain go test shows it and appends the slowest tests; it
// reports whether a package or test failed.
func run(in io.Reader, out io.Writer, top int) (failed bool, err error) {
	buffered := map[string][]string{} // output of a running test, shown only if it fails
	// print writes to out; the first failed write is the run's error.
	print := func(format string, a ...any) {
		if err == nil {
			_, err = fmt.Fprintf(out, format, a...)
		}
	}
	var times []timing
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if json.Unmarshal(line, &ev) != nil || ev.Action == "" {
			print("%s\n", line) // not an event (a build error): as it came
			continue
		}
		key := ev.Package + " " + ev.Test
		switch {
		case ev.Test != "" && ev.Action == "output":
			if !strings.HasPrefix(ev.Output, "=== ") { // -v's progress lines: go test without -v has none
				buffered[key] = append(buffered[key], ev.Output)
			}
		case ev.Test != "" && (ev.Action == "pass" || ev.Action == "skip"):
			delete(buffered, key)
			if ev.Action == "pass" && !strings.Contains(ev.Test, "/") {
				times = append(times, timing{ev.Package + "." + ev.Test, ev.Elapsed})
			}
		case ev.Test != "" && ev.Action == "fail":
			failed = true
			print("%s", strings.Join(buffered[key], ""))
			delete(buffered, key)
		case ev.Test == "" && ev.Action == "output":
			// A package's own output (a TestMain's, a suite's logger) is shown only when the
			// package fails, as go test without -v does; its closing line always.
			switch o := ev.Output; {
			case closing(o):
				print("%s", o)
			case !strings.HasPrefix(o, "=== ") && o != "PASS\n":
				buffered[key] = append(buffered[key], o)
			}
		case ev.Action == "build-output":
			print("%s", ev.Output)
		case ev.Test == "" && ev.Action == "pass":
			delete(buffered, key)
		case ev.Test == "" && ev.Action == "fail":
			failed = true
			print("%s", strings.Join(buffered[key], ""))
			delete(buffered, key)
		}
	}
	if serr := sc.Err(); serr != nil {
		return failed, serr
	}
	sort.Slice(times, func(i, j int) bool { return times[i].elapsed > times[j].elapsed })
	if len(times) > top {
		times = times[:top]
	}
	if len(times) > 0 {
		print("\nslowest %d tests:\n", len(times))
		for _, t := range times {
			print("%8.2fs  %s\n", t.elapsed, t.name)
		}
	}
	return failed, err
}
