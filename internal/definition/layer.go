package definition

// Kind is the layer a document belongs to, widest first.
type Kind string

// The four layers (docs/design.md, "Four layers, merged per field"), in merge order.
const (
	// KindBuiltin is the layer compiled into the binary,
	// extended by the --defaults-dir files.
	KindBuiltin Kind = "builtin"
	// KindSystem is the operator's overrule: tenant SystemTenant, project TenantProject.
	KindSystem Kind = "system"
	// KindTenant is the holder's tenant with project TenantProject.
	KindTenant Kind = "tenant"
	// KindProject is the holder's tenant and project.
	KindProject Kind = "project"
)

// Reserved scope names.
const (
	// SystemTenant is the tenant of the system layer.
	SystemTenant = "_vance"
	// TenantProject is the project of the system and the tenant layers.
	TenantProject = "_tenant"
)

// Field is the path of a mergeable field of a definition document.
type Field string

// The mergeable fields.
const (
	FieldResource      Field = "resource"
	FieldLevelsGlobal  Field = "levels.global"
	FieldLevelsTenant  Field = "levels.tenant"
	FieldLevelsProject Field = "levels.project"
	FieldLevelsUser    Field = "levels.user"
	FieldTTLSeconds    Field = "ttlSeconds"
	FieldWaitMs        Field = "waitMs"
	FieldFairness      Field = "fairness"
	FieldMaxPriority   Field = "maxPriority"
	FieldPriorityAge   Field = "priorityAgeBoundSeconds"
	// The borrowing fields (docs/borrowing.md) merge one by one, like the levels.
	FieldBorrowEnabled Field = "borrowing.enabled"
	FieldBorrowMax     Field = "borrowing.maxBorrowed"
	FieldBorrowGrace   Field = "borrowing.graceSeconds"
)

// AllFields returns the mergeable fields in document order.
func AllFields() []Field {
	return []Field{FieldResource, FieldLevelsGlobal, FieldLevelsTenant, FieldLevelsProject,
		FieldLevelsUser, FieldTTLSeconds, FieldWaitMs, FieldFairness, FieldMaxPriority, FieldPriorityAge,
		FieldBorrowEnabled, FieldBorrowMax, FieldBorrowGrace}
}

// Owns reports whether a layer of the kind may set the field: the field-ownership table of
// docs/design.md, "Four layers, merged per field".
//
//	levels.global, fairness, maxPriority,       builtin, system
//	priorityAgeBoundSeconds, borrowing.*
//	resource, levels.tenant                     builtin, system, tenant
//	levels.project, levels.user, ttlSeconds,    all four
//	waitMs
func Owns(kind Kind, field Field) bool {
	switch field {
	case FieldLevelsGlobal, FieldFairness, FieldMaxPriority, FieldPriorityAge,
		FieldBorrowEnabled, FieldBorrowMax, FieldBorrowGrace:
		// fairness and the priorities order the waiters of every tenant on a shared
		// resource: like the global ceiling they are the operator's, so that no tenant makes
		// itself urgent (docs/waiting.md, "Priority"). Borrowing lends one tenant what the
		// others leave idle: a tenant that could switch it on would lend itself their share.
		return kind == KindBuiltin || kind == KindSystem
	case FieldResource, FieldLevelsTenant:
		return kind == KindBuiltin || kind == KindSystem || kind == KindTenant
	case FieldLevelsProject, FieldLevelsUser, FieldTTLSeconds, FieldWaitMs:
		return kind == KindBuiltin || kind == KindSystem || kind == KindTenant || kind == KindProject
	default:
		return false
	}
}

// Levels are optional caps; nil means the document does not set the level.
type Levels struct {
	Global  *int32 `json:"global,omitempty"`
	Tenant  *int32 `json:"tenant,omitempty"`
	Project *int32 `json:"project,omitempty"`
	User    *int32 `json:"user,omitempty"`
}

// Layer is one definition document of a lease name at one layer, independent of where it is
// stored. Nil fields are not set by the document.
type Layer struct {
	// Kind is the layer.
	Kind Kind
	// Source names the document in messages, e.g. "built-in tex.yaml".
	Source string
	// Name is the lease name.
	Name string
	// Tenant and Project are the document's scope; empty for KindBuiltin.
	Tenant, Project string

	Resource   *string
	Levels     Levels
	TTLSeconds *int32
	WaitMs     *int32
	Fairness   *Fairness
	// MaxPriority bounds the priority an acquisition may ask for; PriorityAgeBoundSeconds
	// serves a waiter older than that as of the highest priority (docs/waiting.md, "Priority").
	MaxPriority             *int32
	PriorityAgeBoundSeconds *int32
	// Borrowing: docs/borrowing.md; each field is set or not on its own.
	Borrowing BorrowingLayer
}

// BorrowingLayer is a document's borrowing; nil fields are not set.
type BorrowingLayer struct {
	Enabled      *bool  `json:"enabled,omitempty"`
	MaxBorrowed  *int32 `json:"maxBorrowed,omitempty"`
	GraceSeconds *int32 `json:"graceSeconds,omitempty"`
}

// SetFields returns the fields the document sets, in document order.
func (l Layer) SetFields() []Field {
	var out []Field
	for _, f := range AllFields() {
		if l.has(f) {
			out = append(out, f)
		}
	}
	return out
}

func (l Layer) has(f Field) bool {
	switch f {
	case FieldResource:
		return l.Resource != nil
	case FieldLevelsGlobal:
		return l.Levels.Global != nil
	case FieldLevelsTenant:
		return l.Levels.Tenant != nil
	case FieldLevelsProject:
		return l.Levels.Project != nil
	case FieldLevelsUser:
		return l.Levels.User != nil
	case FieldTTLSeconds:
		return l.TTLSeconds != nil
	case FieldWaitMs:
		return l.WaitMs != nil
	case FieldFairness:
		return l.Fairness != nil
	case FieldMaxPriority:
		return l.MaxPriority != nil
	case FieldPriorityAge:
		return l.PriorityAgeBoundSeconds != nil
	case FieldBorrowEnabled:
		return l.Borrowing.Enabled != nil
	case FieldBorrowMax:
		return l.Borrowing.MaxBorrowed != nil
	case FieldBorrowGrace:
		return l.Borrowing.GraceSeconds != nil
	default:
		return false
	}
}

// IgnoredFields returns the fields the document sets that its layer does not own. The merge
// ignores them; they are reported in the document's status.
func IgnoredFields(l Layer) []Field {
	var out []Field
	for _, f := range l.SetFields() {
		if !Owns(l.Kind, f) {
			out = append(out, f)
		}
	}
	return out
}

// LayerKey identifies a stored layer document: at most one document may exist per key.
type LayerKey struct {
	Name, Tenant, Project string
}

// Kind is the layer of documents stored under the key.
func (k LayerKey) Kind() Kind {
	return KindOf(k.Tenant, k.Project)
}

// String renders the key as name@tenant/project.
func (k LayerKey) String() string {
	return k.Name + "@" + k.Tenant + "/" + k.Project
}

// Affects reports whether a change of the document under k can change the merged definition
// at scope (the key of another document or of a resolution): a system document affects every
// scope of its name, a tenant document every scope of its name in its tenant, a project
// document only its own scope.
func (k LayerKey) Affects(scope LayerKey) bool {
	if k.Name != scope.Name {
		return false
	}
	switch k.Kind() {
	case KindSystem:
		return true
	case KindTenant:
		return k.Tenant == scope.Tenant
	default:
		return k.Tenant == scope.Tenant && k.Project == scope.Project
	}
}

// KindOf returns the layer of documents stored at scope (tenant, project).
func KindOf(tenant, project string) Kind {
	switch {
	case tenant == SystemTenant && project == TenantProject:
		return KindSystem
	case project == TenantProject:
		return KindTenant
	default:
		return KindProject
	}
}

// ScopeKeys returns the keys of the stored documents that apply to an acquisition of name in
// (tenant, project), widest first: the system document, the tenant document (unless the scope
// is the system scope) and the project document (unless project is TenantProject).
func ScopeKeys(tenant, project, name string) []LayerKey {
	keys := []LayerKey{{Name: name, Tenant: SystemTenant, Project: TenantProject}}
	if tenant != SystemTenant {
		keys = append(keys, LayerKey{Name: name, Tenant: tenant, Project: TenantProject})
	}
	if project != TenantProject {
		keys = append(keys, LayerKey{Name: name, Tenant: tenant, Project: project})
	}
	return keys
}
