package definition

import (
	"fmt"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
)

// InlineSpec is a lease definition carried inline by a consumer (docs/design.md, "Inline
// definitions"), decodable from the request JSON. Resource, Levels.Global, Levels.Tenant and
// Fairness exist only so that a request setting them can be rejected by name.
type InlineSpec struct {
	Name       string    `json:"name"`
	Resource   *string   `json:"resource,omitempty"`
	Levels     Levels    `json:"levels,omitzero"`
	TTLSeconds *int32    `json:"ttlSeconds,omitempty"`
	WaitMs     *int32    `json:"waitMs,omitempty"`
	Fairness   *Fairness `json:"fairness,omitempty"`
}

// inlineField is the request path of an inline field, as reported in an *InvalidError.
func inlineField(f Field) string { return "inline." + string(f) }

// Inline resolves an inline definition for (tenant, project): no layers and no merge. The
// same ownership as for the project layer applies, but a field the project may not set is
// rejected rather than ignored: resource, levels.global, levels.tenant and fairness fail with an
// *InvalidError naming the field. The counter lives on the project-private resource
// mcp-inline:<tenant>/<project>/<name>, so an inline definition can never occupy a shared
// funnel. Without any cap the definition is a NOOP.
func Inline(tenant, project string, spec InlineSpec) (Definition, error) {
	if err := ValidateScope(tenant, project); err != nil {
		return Definition{}, err
	}
	if spec.Name == "" {
		return Definition{}, &lease.InvalidError{Field: "inline.name", Detail: "is required"}
	}
	if !ValidName(spec.Name) {
		return Definition{}, &lease.InvalidError{Field: "inline.name",
			Detail: fmt.Sprintf("%q is not a valid lease name (want [A-Za-z0-9][A-Za-z0-9_-]{0,63})", spec.Name)}
	}
	l := Layer{Kind: KindProject, Name: spec.Name, Resource: spec.Resource, Levels: spec.Levels,
		TTLSeconds: spec.TTLSeconds, WaitMs: spec.WaitMs, Fairness: spec.Fairness}
	if ign := IgnoredFields(l); len(ign) > 0 {
		return Definition{}, &lease.InvalidError{Field: inlineField(ign[0]),
			Detail: "is not allowed in an inline definition (only levels.project, levels.user, ttlSeconds and waitMs); shared ceilings belong in a name reference"}
	}
	for _, c := range []struct {
		field Field
		v     *int32
	}{{FieldLevelsProject, spec.Levels.Project}, {FieldLevelsUser, spec.Levels.User}} {
		if c.v != nil && *c.v < 1 {
			return Definition{}, &lease.InvalidError{Field: inlineField(c.field), Detail: fmt.Sprintf("cap must be at least 1, got %d", *c.v)}
		}
	}
	d := Definition{
		Name:     spec.Name,
		Resource: InlineResource(tenant, project, spec.Name),
		Caps:     Caps{Project: deref(spec.Levels.Project), User: deref(spec.Levels.User)},
		TTL:      DefaultTTL,
		Wait:     DefaultWait,
		Inline:   true,
		Fairness: DefaultFairness, // a project-private resource: no other tenant waits there
	}
	if v := spec.TTLSeconds; v != nil {
		if *v < 1 || *v > MaxTTLSeconds {
			return Definition{}, &lease.InvalidError{Field: inlineField(FieldTTLSeconds),
				Detail: fmt.Sprintf("must be between 1 and %d, got %d", MaxTTLSeconds, *v)}
		}
		d.TTL = time.Duration(*v) * time.Second
	}
	if v := spec.WaitMs; v != nil {
		if *v < 0 || *v > MaxWaitMs {
			return Definition{}, &lease.InvalidError{Field: inlineField(FieldWaitMs),
				Detail: fmt.Sprintf("must be between 0 and %d, got %d", MaxWaitMs, *v)}
		}
		d.Wait = time.Duration(*v) * time.Millisecond
	}
	return d, nil
}
