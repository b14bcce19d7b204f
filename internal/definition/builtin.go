package definition

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/vancetope/lease-operator/internal/lease"
	"sigs.k8s.io/yaml"
)

// compiled holds the built-in documents compiled into the binary, one <name>.yaml per lease.
//
//go:embed builtin/*.yaml
var compiled embed.FS

// document is the YAML form of a definition document (docs/design.md, "Lease definitions").
type document struct {
	Name       string    `json:"name"`
	Resource   *string   `json:"resource,omitempty"`
	Levels     *Levels   `json:"levels,omitempty"`
	TTLSeconds *int32    `json:"ttlSeconds,omitempty"`
	WaitMs     *int32    `json:"waitMs,omitempty"`
	Fairness   *Fairness `json:"fairness,omitempty"`
	// MaxPriority and PriorityAgeBoundSeconds: docs/waiting.md, "Priority".
	MaxPriority             *int32 `json:"maxPriority,omitempty"`
	PriorityAgeBoundSeconds *int32 `json:"priorityAgeBoundSeconds,omitempty"`
	// Borrowing: docs/borrowing.md.
	Borrowing *BorrowingLayer `json:"borrowing,omitempty"`
}

// ParseDocument parses a built-in document named <name>.yaml strictly: unknown or duplicate
// fields, non-numeric caps and any invalid value fail, and the document's name must match the
// file name. source names the document in messages.
func ParseDocument(fileName string, data []byte, source string) (Layer, error) {
	name, ok := strings.CutSuffix(fileName, ".yaml")
	if !ok {
		return Layer{}, fmt.Errorf("file %q: want <name>.yaml", fileName)
	}
	var doc document
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return Layer{}, fmt.Errorf("parsing %s: %w", fileName, err)
	}
	if doc.Name == "" {
		return Layer{}, &lease.InvalidError{Field: "name", Detail: "is required"}
	}
	if doc.Name != name {
		return Layer{}, &lease.InvalidError{Field: "name", Detail: fmt.Sprintf("%q must match the file name %q", doc.Name, fileName)}
	}
	l := Layer{Kind: KindBuiltin, Source: source, Name: doc.Name, Resource: doc.Resource,
		TTLSeconds: doc.TTLSeconds, WaitMs: doc.WaitMs, Fairness: doc.Fairness,
		MaxPriority: doc.MaxPriority, PriorityAgeBoundSeconds: doc.PriorityAgeBoundSeconds}
	if doc.Levels != nil {
		l.Levels = *doc.Levels
	}
	if doc.Borrowing != nil {
		l.Borrowing = *doc.Borrowing
	}
	if err := ValidateLayer(l); err != nil {
		return Layer{}, err
	}
	return l, nil
}

// Builtins is the built-in layer: the documents compiled into the binary, extended (and per
// name replaced) by the files of a defaults directory. A broken file makes its lease name
// unavailable in every scope; it never falls back to the compiled-in document, because a
// silently skipped layer might carry the cap that protects the resource.
type Builtins struct {
	// missing, when set, makes every lease name unavailable: the configured built-in layer
	// could not be loaded (see UnavailableBuiltins).
	missing  *UnavailableError
	layers   map[string]Layer
	broken   map[string]error
	sources  map[string]string
	problems []error
}

// LoadBuiltins loads the compiled-in documents and then the *.yaml files of defaults (nil for
// none). It fails only when the compiled-in documents are broken or the directory cannot be
// listed; a broken file is recorded for its lease name (see Problems). Hidden entries (such
// as the ..data links of a mounted ConfigMap), directories and files that are not YAML are
// skipped; a file named *.yml is reported as broken under its name.
func LoadBuiltins(defaults fs.FS) (*Builtins, error) {
	b := &Builtins{layers: map[string]Layer{}, broken: map[string]error{}, sources: map[string]string{}}
	sub, err := fs.Sub(compiled, "builtin")
	if err != nil {
		return nil, fmt.Errorf("opening compiled-in definitions: %w", err)
	}
	if err := b.load(sub, "built-in"); err != nil {
		return nil, fmt.Errorf("loading compiled-in definitions: %w", err)
	}
	if len(b.problems) > 0 {
		return nil, fmt.Errorf("compiled-in definitions are broken: %w", errors.Join(b.problems...))
	}
	if defaults != nil {
		if err := b.load(defaults, "defaults-dir"); err != nil {
			return nil, fmt.Errorf("loading the defaults directory: %w", err)
		}
	}
	return b, nil
}

func (b *Builtins) load(fsys fs.FS, origin string) error {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return err
	}
	for _, e := range entries {
		file := e.Name()
		if strings.HasPrefix(file, ".") {
			continue
		}
		if fi, err := fs.Stat(fsys, file); err == nil && fi.IsDir() {
			continue
		}
		source := origin + " " + file
		name, isYAML := strings.CutSuffix(file, ".yaml")
		if !isYAML {
			if yml, ok := strings.CutSuffix(file, ".yml"); ok && ValidName(yml) {
				b.fail(yml, source, fmt.Errorf("file %q: want %s.yaml", file, yml))
			}
			continue
		}
		if !ValidName(name) {
			b.problems = append(b.problems, fmt.Errorf("%s: %q is not a valid lease name; the file is not used", source, name))
			continue
		}
		data, err := fs.ReadFile(fsys, file)
		if err != nil {
			b.fail(name, source, fmt.Errorf("reading: %w", err))
			continue
		}
		l, err := ParseDocument(file, data, source)
		if err != nil {
			b.fail(name, source, err)
			continue
		}
		if _, bad := b.broken[name]; bad {
			continue // another file of the directory for the same name is broken
		}
		b.layers[name] = l
		b.sources[name] = source
	}
	return nil
}

func (b *Builtins) fail(name, source string, err error) {
	delete(b.layers, name)
	b.sources[name] = source
	b.broken[name] = err
	b.problems = append(b.problems, &UnavailableError{Name: name, Source: source, Err: err})
}

// UnavailableBuiltins is the built-in layer of a process that could not load the one it was
// configured with (source names it): every lease name is unavailable, so that the process
// fails closed rather than resolving without that layer, which may carry the only cap of a
// lease (docs/tenancy.md).
func UnavailableBuiltins(source string, err error) *Builtins {
	return &Builtins{missing: &UnavailableError{Source: source, Err: err}, problems: []error{fmt.Errorf("%s: %w", source, err)}}
}

// Layer returns the built-in document of name: nil if there is none, an *UnavailableError if
// its file is broken or the layer could not be loaded.
func (b *Builtins) Layer(name string) (*Layer, error) {
	if b == nil {
		return nil, nil
	}
	if b.missing != nil {
		return nil, &UnavailableError{Name: name, Source: b.missing.Source, Err: b.missing.Err}
	}
	if err, ok := b.broken[name]; ok {
		return nil, &UnavailableError{Name: name, Source: b.sources[name], Err: err}
	}
	l, ok := b.layers[name]
	if !ok {
		return nil, nil
	}
	return &l, nil
}

// Names returns the lease names with a built-in document, broken ones included, sorted.
func (b *Builtins) Names() []string {
	if b == nil {
		return nil
	}
	names := make([]string, 0, len(b.layers)+len(b.broken))
	for n := range b.layers {
		names = append(names, n)
	}
	for n := range b.broken {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Problems returns the broken files of the defaults directory, for the caller to report at
// start-up. The lease names of attributable problems are unavailable.
func (b *Builtins) Problems() []error {
	if b == nil {
		return nil
	}
	return slices.Clone(b.problems)
}
