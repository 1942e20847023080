// Command conveyor is the Conveyor LLM server's command-line tool. Each subcommand
// lives in its own file and registers itself from init; `conveyor help` lists them. A
// large subcommand is split by job into files named after it: bench*.go, and
// runbatch.go (the command and its scheduling: submitting lines, concurrency, retries)
// with runbatch_input.go (reading and checking the batch file), runbatch_output.go
// (the results file and resuming) and runbatch_progress.go (the progress bar).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
)

// command is one subcommand: run receives the arguments after the command's name.
type command struct {
	name    string
	summary string
	run     func(args []string) error
}

// commands holds every registered subcommand by name.
var commands = map[string]command{}

// register adds c to the subcommands; it is called from init functions, so a
// duplicate or empty name is a programming error and panics at start-up.
func register(c command) {
	if c.name == "" || c.run == nil {
		panic("conveyor: register: command needs a name and a run function")
	}
	if _, dup := commands[c.name]; dup {
		panic("conveyor: register: duplicate command " + c.name)
	}
	commands[c.name] = c
}

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

// runMain dispatches args to a subcommand and returns the process exit code. Errors
// are printed as one line, "conveyor: <message>".
func runMain(args []string, stdout, stderr io.Writer) (code int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "conveyor: internal error: %v\n", r)
			code = 1
		}
	}()
	if len(args) == 0 {
		usage(stderr) // as go and git do: a command is needed
		return 2
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && name == "help" {
			if c, ok := commands[args[1]]; ok {
				return report(stderr, c.run([]string{"-h"}))
			}
			return report(stderr, fmt.Errorf("unknown command %q (run `conveyor help`)", args[1]))
		}
		usage(stdout)
		return 0
	}
	c, ok := commands[name]
	if !ok {
		return report(stderr, fmt.Errorf("unknown command %q (run `conveyor help`)", name))
	}
	return report(stderr, c.run(args[1:]))
}

// report prints err as one line and returns the exit code.
func report(stderr io.Writer, err error) int {
	if err == nil {
		return 0
	}
	msg := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " ")), " ")
	fmt.Fprintf(stderr, "conveyor: %s\n", msg)
	return 1
}

// usage lists the registered commands.
func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	width := 0
	for n := range commands {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: conveyor <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run `conveyor <command> -h` for a command's flags.")
}

// parseFlags parses a subcommand's args into fs. A bad flag or a stray argument is an
// error naming the command ("generate: flag provided but not defined: -x"), reported in
// one line by runMain instead of the flag package's usage dump; -h prints the usage and
// returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err != nil:
		return fmt.Errorf("%s: %v", fs.Name(), err)
	case fs.NArg() > 0:
		return fmt.Errorf("%s: unexpected argument %q (flags come before it; quote a value with spaces)", fs.Name(), fs.Arg(0))
	}
	return nil
}

// notifyContext returns a context that is cancelled by the first of sigs (or by stop).
// Unlike signal.NotifyContext it hands the signals back to their default action before
// the context is cancelled, so while a command winds down gracefully a second Ctrl-C or
// SIGTERM ends the process at once.
func notifyContext(parent context.Context, sigs ...os.Signal) (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	go func() {
		select {
		case <-ch:
		case <-ctx.Done():
		}
		signal.Stop(ch)
		cancel()
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel()
	}
}
