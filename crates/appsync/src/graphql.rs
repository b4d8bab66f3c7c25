//! The generic pub/sub GraphQL API: the one schema AWS's real-time demo
//! creates, checked with a real GraphQL parser (async-graphql-parser):
//!
//! ```graphql
//! type Channel { name: String!  data: AWSJSON! }
//! type Mutation { publish(name: String!, data: AWSJSON!): Channel }
//! type Query { getChannel: Channel }
//! type Subscription { subscribe(name: String!): Channel
//!                       @aws_subscribe(mutations: ["publish"]) }
//! ```
//!
//! Any operation against that schema is accepted as GraphQL allows it:
//! any operation name (picked with `operationName` when a document holds
//! several), arguments inline or as variables (with defaults), aliases,
//! `__typename`, inline fragments and named fragments on `Channel`,
//! `@skip`/`@include`. Anything else (another field, a wrong argument, a
//! missing selection, a syntax error) is a GraphQL error with a message
//! and a location, never a crash. Every size is bounded.
//!
//! About 740 lines of code and 210 of unit tests: the checks of one
//! document against the one schema are one walk (`Cx`), kept together so
//! that every bound it enforces is visible in one place.

use crate::nesting;
use crate::wire::ChannelField;
use async_graphql_parser::types::{
    BaseType, DocumentOperations, ExecutableDocument, FragmentDefinition, OperationType, Selection,
    SelectionSet, VariableDefinition,
};
use async_graphql_parser::{Pos, Positioned};
use async_graphql_value::{ConstValue, Name, Value as GqlValue};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// Longest query document accepted, in bytes.
pub const MAX_QUERY_BYTES: usize = 16 * 1024;
/// Most `publish` fields in one mutation.
pub const MAX_PUBLISHES: usize = 10;
/// Longest channel `name`, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// Largest `data`, in bytes (AppSync's subscription payload limit).
pub const MAX_DATA_BYTES: usize = 240 * 1024;
/// Most fragment spreads followed while collecting one selection.
const MAX_FRAGMENT_DEPTH: usize = 16;
/// Most fields one selection may produce (after fragments).
const MAX_FIELDS: usize = 64;
/// Most selections visited in one document while expanding fragments. The
/// other bounds keep each path short, but a fragment that spreads the next
/// one several times multiplies the paths: 16 levels of 4 spreads of a
/// skipped field is 4^16 visits from a few hundred bytes.
const MAX_VISITS: usize = 1024;

/// A GraphQL error: AppSync's `errorType`, a message, where.
#[derive(Debug, Clone, PartialEq)]
pub struct GqlError {
    pub error_type: &'static str,
    pub message: String,
    pub pos: Option<Pos>,
}

impl GqlError {
    fn new(error_type: &'static str, message: impl Into<String>, pos: Option<Pos>) -> GqlError {
        GqlError {
            error_type,
            message: message.into(),
            pos,
        }
    }

    fn validation(message: impl Into<String>, pos: Pos) -> GqlError {
        GqlError::new("ValidationError", message, Some(pos))
    }

    /// The error as AppSync writes it in an `errors` array.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "errorType": self.error_type, "message": self.message });
        if let Some(p) = self.pos {
            v["locations"] = json!([{ "line": p.line, "column": p.column }]);
        }
        v
    }
}

/// A request: the document, its variables and the operation to run.
#[derive(Debug, Default, Clone, serde::Deserialize)]
pub struct Request {
    pub query: Option<String>,
    #[serde(default)]
    pub variables: Option<Value>,
    #[serde(rename = "operationName", default)]
    pub operation_name: Option<String>,
}

/// A checked `subscribe` operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Subscribe {
    /// Response key of the `subscribe` field (its alias, if any).
    pub root: String,
    pub name: String,
    pub fields: Vec<(String, ChannelField)>,
}

/// One root field of a mutation or query, in selection order.
#[derive(Debug, Clone, PartialEq)]
pub enum RootField {
    Typename {
        key: String,
        type_name: &'static str,
    },
    Publish {
        key: String,
        name: String,
        /// The AWSJSON value: a string holding valid JSON.
        data: String,
        fields: Vec<(String, ChannelField)>,
    },
    /// `getChannel`: the demo schema's query, which answers null.
    Null { key: String },
}

/// What a document asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    Subscribe(Subscribe),
    Mutation(Vec<RootField>),
    Query(Vec<RootField>),
}

/// Parse and validate `req` against the generic pub/sub schema.
pub fn parse(req: &Request) -> Result<Operation, GqlError> {
    let query = req
        .query
        .as_deref()
        .ok_or_else(|| GqlError::new("BadRequestException", "Missing `query`", None))?;
    if query.len() > MAX_QUERY_BYTES {
        return Err(GqlError::new(
            "BadRequestException",
            format!("The query is larger than {MAX_QUERY_BYTES} bytes"),
            None,
        ));
    }
    // Before the parser: it and every walk below recurse once per level.
    if nesting::exceeds(query, nesting::MAX_NESTING) {
        return Err(GqlError::new(
            "BadRequestException",
            format!(
                "The query nests deeper than {} levels of brackets",
                nesting::MAX_NESTING
            ),
            None,
        ));
    }
    let vars = match &req.variables {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(GqlError::new(
                "BadRequestException",
                "`variables` must be an object",
                None,
            ))
        }
    };
    let doc = async_graphql_parser::parse_query(query).map_err(|e| {
        let pos = e.positions().next();
        GqlError::new("InvalidSyntax", format!("Invalid syntax: {e}"), pos)
    })?;
    let op = pick_operation(&doc, req.operation_name.as_deref())?;
    let cx = Cx {
        vars: &vars,
        defs: &op.node.variable_definitions,
        fragments: &doc,
        visits: std::cell::Cell::new(0),
    };
    if let Some(d) = op.node.directives.first() {
        return Err(GqlError::validation(
            format!(
                "Unsupported directive '@{}' on the operation",
                d.node.name.node
            ),
            d.pos,
        ));
    }
    for def in &op.node.variable_definitions {
        cx.check_default(def)?;
    }
    match op.node.ty {
        OperationType::Subscription => {
            let roots = cx.collect(&op.node.selection_set.node, "Subscription")?;
            let [field] = roots.as_slice() else {
                return Err(GqlError::validation(
                    "A subscription must select exactly one field",
                    op.pos,
                ));
            };
            let f = &field.node;
            if f.name.node != "subscribe" {
                return Err(undefined(&f.name.node, "Subscription", field.pos));
            }
            let name = cx.arguments(f, "subscribe")?.0;
            let fields = cx.channel_selection(f, field.pos)?;
            Ok(Operation::Subscribe(Subscribe {
                root: f.response_key().node.to_string(),
                name,
                fields,
            }))
        }
        OperationType::Mutation => {
            let roots = cx.collect(&op.node.selection_set.node, "Mutation")?;
            let mut out = Vec::new();
            let mut publishes = 0;
            for field in roots {
                let f = &field.node;
                let key = f.response_key().node.to_string();
                match f.name.node.as_str() {
                    "__typename" => out.push(RootField::Typename {
                        key,
                        type_name: "Mutation",
                    }),
                    "publish" => {
                        publishes += 1;
                        if publishes > MAX_PUBLISHES {
                            return Err(GqlError::validation(
                                format!("At most {MAX_PUBLISHES} publish fields per mutation"),
                                field.pos,
                            ));
                        }
                        let (name, data) = cx.arguments(f, "publish")?;
                        let fields = cx.channel_selection(f, field.pos)?;
                        out.push(RootField::Publish {
                            key,
                            name,
                            data: data.unwrap_or_default(),
                            fields,
                        });
                    }
                    other => return Err(undefined(other, "Mutation", field.pos)),
                }
            }
            Ok(Operation::Mutation(out))
        }
        OperationType::Query => {
            let roots = cx.collect(&op.node.selection_set.node, "Query")?;
            let mut out = Vec::new();
            for field in roots {
                let f = &field.node;
                let key = f.response_key().node.to_string();
                match f.name.node.as_str() {
                    "__typename" => out.push(RootField::Typename {
                        key,
                        type_name: "Query",
                    }),
                    "getChannel" => {
                        if let Some((n, _)) = f.arguments.first() {
                            return Err(GqlError::validation(
                                format!("Unknown argument '{}' on field 'getChannel'", n.node),
                                n.pos,
                            ));
                        }
                        cx.channel_selection(f, field.pos)?;
                        out.push(RootField::Null { key });
                    }
                    "__schema" | "__type" => {
                        return Err(GqlError::validation(
                            "Introspection is not supported",
                            field.pos,
                        ))
                    }
                    other => return Err(undefined(other, "Query", field.pos)),
                }
            }
            Ok(Operation::Query(out))
        }
    }
}

fn undefined(field: &str, ty: &str, pos: Pos) -> GqlError {
    GqlError::validation(
        format!(
            "Validation error of type FieldUndefined: Field '{}' in type '{ty}' is undefined",
            bounded(field)
        ),
        pos,
    )
}

/// A name from the client, bounded for messages.
fn bounded(s: &str) -> String {
    s.chars().take(64).collect()
}

fn pick_operation<'d>(
    doc: &'d ExecutableDocument,
    name: Option<&str>,
) -> Result<&'d Positioned<async_graphql_parser::types::OperationDefinition>, GqlError> {
    match (&doc.operations, name) {
        (DocumentOperations::Single(op), _) => Ok(op),
        (DocumentOperations::Multiple(ops), Some(n)) => ops.get(n).ok_or_else(|| {
            GqlError::new(
                "BadRequestException",
                format!("Unknown operation named '{}'", bounded(n)),
                None,
            )
        }),
        (DocumentOperations::Multiple(ops), None) if ops.len() == 1 => {
            Ok(ops.values().next().expect("one operation"))
        }
        (DocumentOperations::Multiple(_), None) => Err(GqlError::new(
            "BadRequestException",
            "Must provide operationName if the query contains several operations",
            None,
        )),
    }
}

/// What validating one operation needs.
struct Cx<'a> {
    vars: &'a Map<String, Value>,
    defs: &'a [Positioned<VariableDefinition>],
    fragments: &'a ExecutableDocument,
    /// Selections visited so far, against [`MAX_VISITS`].
    visits: std::cell::Cell<usize>,
}

type FieldRef<'a> = &'a Positioned<async_graphql_parser::types::Field>;

impl<'a> Cx<'a> {
    /// The fields a selection set selects on `ty`, through fragments and
    /// directives, merged by response key (same key: same field, same
    /// arguments, as GraphQL requires).
    fn collect(&self, set: &'a SelectionSet, ty: &str) -> Result<Vec<FieldRef<'a>>, GqlError> {
        let mut out: Vec<FieldRef<'a>> = Vec::new();
        self.collect_into(set, ty, &mut out, &mut Vec::new())?;
        // Merge by response key.
        let mut merged: Vec<FieldRef<'a>> = Vec::new();
        for f in out {
            let key = f.node.response_key().node.as_str();
            match merged
                .iter()
                .find(|m| m.node.response_key().node.as_str() == key)
            {
                None => merged.push(f),
                Some(m) => {
                    if m.node.name.node != f.node.name.node
                        || !same_arguments(&m.node.arguments, &f.node.arguments)
                    {
                        return Err(GqlError::validation(
                            format!(
                                "Fields '{}' conflict: they select different fields or arguments under one name",
                                bounded(key)
                            ),
                            f.pos,
                        ));
                    }
                }
            }
        }
        Ok(merged)
    }

    fn collect_into(
        &self,
        set: &'a SelectionSet,
        ty: &str,
        out: &mut Vec<FieldRef<'a>>,
        spreads: &mut Vec<&'a str>,
    ) -> Result<(), GqlError> {
        for item in &set.items {
            self.visits.set(self.visits.get() + 1);
            if self.visits.get() > MAX_VISITS {
                return Err(GqlError::validation(
                    format!("The selection expands to more than {MAX_VISITS} selections through fragments"),
                    item.pos,
                ));
            }
            if !self.included(item.node.directives())? {
                continue;
            }
            match &item.node {
                Selection::Field(f) => {
                    out.push(f);
                    if out.len() > MAX_FIELDS {
                        return Err(GqlError::validation("Too many fields selected", f.pos));
                    }
                }
                Selection::InlineFragment(frag) => {
                    if let Some(cond) = &frag.node.type_condition {
                        check_condition(&cond.node.on.node, ty, cond.pos)?;
                    }
                    self.collect_into(&frag.node.selection_set.node, ty, out, spreads)?;
                }
                Selection::FragmentSpread(spread) => {
                    let name = spread.node.fragment_name.node.as_str();
                    let frag: &'a Positioned<FragmentDefinition> =
                        self.fragments.fragments.get(name).ok_or_else(|| {
                            GqlError::validation(
                                format!("Undefined fragment '{}'", bounded(name)),
                                spread.pos,
                            )
                        })?;
                    if spreads.contains(&name) || spreads.len() >= MAX_FRAGMENT_DEPTH {
                        return Err(GqlError::validation(
                            format!(
                                "Fragment '{}' spreads itself (or nests too deep)",
                                bounded(name)
                            ),
                            spread.pos,
                        ));
                    }
                    check_condition(
                        &frag.node.type_condition.node.on.node,
                        ty,
                        frag.node.type_condition.pos,
                    )?;
                    if let Some(d) = frag.node.directives.first() {
                        return Err(GqlError::validation(
                            format!(
                                "Unsupported directive '@{}' on a fragment",
                                d.node.name.node
                            ),
                            d.pos,
                        ));
                    }
                    spreads.push(name);
                    self.collect_into(&frag.node.selection_set.node, ty, out, spreads)?;
                    spreads.pop();
                }
            }
        }
        Ok(())
    }

    /// `@skip(if:)` and `@include(if:)`; any other directive is an error.
    fn included(
        &self,
        directives: &[Positioned<async_graphql_parser::types::Directive>],
    ) -> Result<bool, GqlError> {
        let mut keep = true;
        for d in directives {
            let name = d.node.name.node.as_str();
            let skip = match name {
                "skip" => true,
                "include" => false,
                other => {
                    return Err(GqlError::validation(
                        format!("Unsupported directive '@{}'", bounded(other)),
                        d.pos,
                    ))
                }
            };
            let [(arg, value)] = d.node.arguments.as_slice() else {
                return Err(GqlError::validation(
                    format!("Directive '@{name}' takes exactly one argument, 'if'"),
                    d.pos,
                ));
            };
            if arg.node != "if" {
                return Err(GqlError::validation(
                    format!(
                        "Unknown argument '{}' on directive '@{name}'",
                        bounded(&arg.node)
                    ),
                    arg.pos,
                ));
            }
            let cond = match self.value(&value.node, value.pos, "Boolean")? {
                Value::Bool(b) => b,
                _ => {
                    return Err(GqlError::validation(
                        format!("Argument 'if' of '@{name}' must be a Boolean"),
                        value.pos,
                    ))
                }
            };
            if cond == skip {
                keep = false;
            }
        }
        Ok(keep)
    }

    /// The `Channel` fields selected under `field`.
    fn channel_selection(
        &self,
        field: &'a async_graphql_parser::types::Field,
        pos: Pos,
    ) -> Result<Vec<(String, ChannelField)>, GqlError> {
        let set = &field.selection_set.node;
        if set.items.is_empty() {
            return Err(GqlError::validation(
                format!(
                    "Sub selection required for type 'Channel' of field '{}'",
                    field.name.node
                ),
                pos,
            ));
        }
        let mut out = Vec::new();
        let mut data_selected = false;
        for f in self.collect(set, "Channel")? {
            let kind = match f.node.name.node.as_str() {
                "name" => ChannelField::Name,
                "data" => ChannelField::Data,
                "__typename" => ChannelField::Typename,
                other => return Err(undefined(other, "Channel", f.pos)),
            };
            if let Some((n, _)) = f.node.arguments.first() {
                return Err(GqlError::validation(
                    format!(
                        "Unknown argument '{}' on field '{}'",
                        bounded(&n.node),
                        f.node.name.node
                    ),
                    n.pos,
                ));
            }
            if !f.node.selection_set.node.items.is_empty() {
                return Err(GqlError::validation(
                    format!(
                        "Field '{}' is a scalar and takes no sub selection",
                        f.node.name.node
                    ),
                    f.pos,
                ));
            }
            if kind == ChannelField::Data {
                if data_selected {
                    return Err(GqlError::validation(
                        "Herald sends 'data' once per event: select it under one name only",
                        f.pos,
                    ));
                }
                data_selected = true;
            }
            out.push((f.node.response_key().node.to_string(), kind));
        }
        if out.is_empty() {
            return Err(GqlError::validation(
                "Every field of the selection was skipped",
                pos,
            ));
        }
        Ok(out)
    }

    /// `name` (and `data` for `publish`) of a `subscribe` or `publish`
    /// field, checked.
    fn arguments(
        &self,
        field: &async_graphql_parser::types::Field,
        which: &str,
    ) -> Result<(String, Option<String>), GqlError> {
        let mut name = None;
        let mut data = None;
        for (arg, value) in &field.arguments {
            match (arg.node.as_str(), which) {
                ("name", _) if name.is_none() => {
                    name = Some(self.value(&value.node, value.pos, "String")?)
                }
                ("data", "publish") if data.is_none() => {
                    data = Some(self.value(&value.node, value.pos, "AWSJSON")?)
                }
                (other, _) => {
                    return Err(GqlError::validation(
                        format!(
                            "Unknown or repeated argument '{}' on field '{which}'",
                            bounded(other)
                        ),
                        arg.pos,
                    ))
                }
            }
        }
        let missing = |a: &str| {
            GqlError::validation(
                format!(
                    "Missing field argument '{a}' of type '{}'",
                    if a == "name" { "String!" } else { "AWSJSON!" }
                ),
                field.name.pos,
            )
        };
        let name = match name.ok_or_else(|| missing("name"))? {
            Value::String(s) => s,
            _ => return Err(missing("name")),
        };
        if name.len() > MAX_NAME_BYTES {
            return Err(GqlError::validation(
                format!("Argument 'name' is longer than {MAX_NAME_BYTES} bytes"),
                field.name.pos,
            ));
        }
        let data = if which == "publish" {
            match data.ok_or_else(|| missing("data"))? {
                Value::String(s) => Some(s),
                _ => return Err(missing("data")),
            }
        } else {
            None
        };
        Ok((name, data))
    }

    /// A checked argument value of GraphQL type `ty` (`String`, `AWSJSON`,
    /// `Boolean`), never null: inline or from a variable.
    fn value(&self, v: &GqlValue, pos: Pos, ty: &str) -> Result<Value, GqlError> {
        let json = match v {
            GqlValue::Variable(var) => return self.variable(var, pos, ty),
            GqlValue::String(s) => Value::String(s.clone()),
            GqlValue::Boolean(b) => Value::Bool(*b),
            GqlValue::Null => Value::Null,
            _ => {
                return Err(GqlError::validation(
                    format!("Expected a value of type '{ty}!'"),
                    pos,
                ))
            }
        };
        coerce(json, ty).map_err(|m| GqlError::validation(m, pos))
    }

    fn variable(&self, var: &Name, pos: Pos, ty: &str) -> Result<Value, GqlError> {
        let Some(def) = self.defs.iter().find(|d| d.node.name.node == *var) else {
            return Err(GqlError::validation(
                format!("Variable '${}' is not defined", bounded(var)),
                pos,
            ));
        };
        let declared = match &def.node.var_type.node.base {
            BaseType::Named(n) => n.as_str(),
            BaseType::List(_) => "",
        };
        if declared != ty {
            return Err(GqlError::validation(
                format!(
                    "Variable '${}' of type '{}' used in a position expecting '{ty}!'",
                    bounded(var),
                    def.node.var_type.node
                ),
                pos,
            ));
        }
        let given = match self.vars.get(var.as_str()) {
            Some(v) => v.clone(),
            None => match &def.node.default_value {
                Some(d) => const_to_json(&d.node),
                None => Value::Null,
            },
        };
        coerce(given, ty).map_err(|m| {
            GqlError::new(
                "ValidationError",
                format!("Variable '${}' has an invalid value: {m}", bounded(var)),
                Some(def.pos),
            )
        })
    }

    /// A default value must fit its variable's type.
    fn check_default(&self, def: &Positioned<VariableDefinition>) -> Result<(), GqlError> {
        if let (Some(d), BaseType::Named(n)) =
            (&def.node.default_value, &def.node.var_type.node.base)
        {
            if matches!(n.as_str(), "String" | "AWSJSON" | "Boolean") && d.node != ConstValue::Null
            {
                coerce(const_to_json(&d.node), n.as_str()).map_err(|m| {
                    GqlError::validation(format!("Invalid default value: {m}"), d.pos)
                })?;
            }
        }
        Ok(())
    }
}

/// Whether a type condition applies on `ty`.
fn check_condition(cond: &str, ty: &str, pos: Pos) -> Result<(), GqlError> {
    const TYPES: [&str; 4] = ["Channel", "Mutation", "Query", "Subscription"];
    if cond == ty {
        Ok(())
    } else if TYPES.contains(&cond) {
        Err(GqlError::validation(
            format!("Fragment on '{cond}' cannot be spread where a '{ty}' is selected"),
            pos,
        ))
    } else {
        Err(GqlError::validation(
            format!("Unknown type '{}'", bounded(cond)),
            pos,
        ))
    }
}

/// Input coercion: non-null `String`, `Boolean` or `AWSJSON` (a string
/// holding valid JSON, relayed exactly as given).
fn coerce(v: Value, ty: &str) -> Result<Value, String> {
    match (ty, v) {
        (_, Value::Null) => Err(format!("a non-null {ty} is required")),
        ("String", Value::String(s)) => Ok(Value::String(s)),
        ("Boolean", Value::Bool(b)) => Ok(Value::Bool(b)),
        ("AWSJSON", Value::String(s)) => {
            if s.len() > MAX_DATA_BYTES {
                return Err(format!(
                    "AWSJSON data is larger than {MAX_DATA_BYTES} bytes"
                ));
            }
            serde_json::from_str::<serde::de::IgnoredAny>(&s)
                .map_err(|e| format!("AWSJSON must be a string holding valid JSON ({e})"))?;
            Ok(Value::String(s))
        }
        ("AWSJSON", _) => {
            Err("AWSJSON must be a string holding valid JSON, such as \"{\\\"a\\\":1}\"".into())
        }
        (ty, _) => Err(format!("expected a {ty}")),
    }
}

fn const_to_json(v: &ConstValue) -> Value {
    v.clone().into_json().unwrap_or(Value::Null)
}

fn same_arguments(
    a: &[(Positioned<Name>, Positioned<GqlValue>)],
    b: &[(Positioned<Name>, Positioned<GqlValue>)],
) -> bool {
    let map = |x: &[(Positioned<Name>, Positioned<GqlValue>)]| -> HashMap<String, String> {
        x.iter()
            .map(|(n, v)| (n.node.to_string(), v.node.to_string()))
            .collect()
    };
    a.len() == b.len() && map(a) == map(b)
}

/// A `Channel` object for a response, fields in selection order.
pub fn channel_json(name: &str, data: &str, fields: &[(String, ChannelField)]) -> Value {
    let mut m = Map::new();
    for (key, f) in fields {
        let v = match f {
            ChannelField::Name => Value::String(name.to_owned()),
            ChannelField::Data => Value::String(data.to_owned()),
            ChannelField::Typename => Value::String("Channel".into()),
        };
        m.insert(key.clone(), v);
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(query: &str, variables: Value) -> Request {
        Request {
            query: Some(query.into()),
            variables: Some(variables),
            operation_name: None,
        }
    }

    fn ok(query: &str, variables: Value) -> Operation {
        parse(&req(query, variables)).unwrap_or_else(|e| panic!("{query}: {e:?}"))
    }

    fn err(query: &str, variables: Value) -> GqlError {
        match parse(&req(query, variables)) {
            Ok(op) => panic!("{query}: accepted as {op:?}"),
            Err(e) => e,
        }
    }

    const NAME_DATA: [(&str, ChannelField); 2] =
        [("name", ChannelField::Name), ("data", ChannelField::Data)];

    fn fields(f: &[(&str, ChannelField)]) -> Vec<(String, ChannelField)> {
        f.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn fragments_that_multiply_are_bounded_by_visits() {
        // F0 spreads F1 twice, ... F14 spreads F15 twice: 2^15 paths, each
        // ending at a skipped field, within every other bound.
        let mut q = String::from("subscription { subscribe(name: \"a\") { name ...F0 } }");
        for i in 0..15 {
            q += &format!(" fragment F{i} on Channel {{ ...F{n} ...F{n} }}", n = i + 1);
        }
        q += " fragment F15 on Channel { data @skip(if: true) }";
        let e = err(&q, json!({}));
        assert!(e.message.contains("more than 1024 selections"), "{e:?}");
        // Two levels of the same shape are fine.
        let q = "subscription { subscribe(name: \"a\") { name ...F0 } } \
                 fragment F0 on Channel { ...F1 ...F1 } fragment F1 on Channel { data }";
        assert!(matches!(ok(q, json!({})), Operation::Subscribe(_)));
    }

    #[test]
    fn the_benchmark_and_demo_operations() {
        let publish = ok(
            "mutation PublishData($name: String!, $data: AWSJSON!) { publish(name: $name, data: $data) { name data } }",
            json!({ "name": "room", "data": "{\"a\":1}" }),
        );
        assert_eq!(
            publish,
            Operation::Mutation(vec![RootField::Publish {
                key: "publish".into(),
                name: "room".into(),
                data: "{\"a\":1}".into(),
                fields: fields(&NAME_DATA),
            }])
        );
        let sub = ok(
            "subscription SubscribeToData($name: String!) { subscribe(name: $name) { name data } }",
            json!({ "name": "room" }),
        );
        assert_eq!(
            sub,
            Operation::Subscribe(Subscribe {
                root: "subscribe".into(),
                name: "room".into(),
                fields: fields(&NAME_DATA),
            })
        );
    }

    #[test]
    fn inline_arguments_aliases_fragments_directives() {
        let op = ok(
            r#"subscription { s: subscribe(name: "r") { ...F n: name ... on Channel { __typename } data @skip(if: true) } }
               fragment F on Channel { data }"#,
            json!({}),
        );
        assert_eq!(
            op,
            Operation::Subscribe(Subscribe {
                root: "s".into(),
                name: "r".into(),
                fields: fields(&[
                    ("data", ChannelField::Data),
                    ("n", ChannelField::Name),
                    ("__typename", ChannelField::Typename),
                ]),
            })
        );
        let op = ok(
            r#"mutation M($d: AWSJSON! = "[1]", $yes: Boolean!) {
                 a: publish(name: "x", data: $d) { data }
                 b: publish(name: "y", data: "2") @include(if: $yes) { name }
                 __typename }"#,
            json!({ "yes": false }),
        );
        let Operation::Mutation(roots) = op else {
            panic!()
        };
        assert_eq!(roots.len(), 2);
        assert_eq!(
            roots[1],
            RootField::Typename {
                key: "__typename".into(),
                type_name: "Mutation"
            }
        );
        let op = ok("query { getChannel { name } }", json!(null));
        assert_eq!(
            op,
            Operation::Query(vec![RootField::Null {
                key: "getChannel".into()
            }])
        );
    }

    #[test]
    fn operation_names() {
        let doc = "query A { __typename } subscription B { subscribe(name: \"n\") { name } }";
        let mut r = req(doc, json!({}));
        assert_eq!(parse(&r).unwrap_err().error_type, "BadRequestException");
        r.operation_name = Some("B".into());
        assert!(matches!(parse(&r).unwrap(), Operation::Subscribe(_)));
        r.operation_name = Some("C".into());
        assert!(parse(&r).is_err());
    }

    #[test]
    fn errors_with_messages() {
        let cases: &[(&str, Value, &str)] = &[
            ("subscription { subscribe(name: \"a\") { name", json!({}), "Invalid syntax"),
            ("mutation { delete(name: \"a\") { name } }", json!({}), "FieldUndefined"),
            ("subscription { subscribe(name: \"a\") }", json!({}), "Sub selection required"),
            ("subscription { subscribe(name: \"a\") { name { x } } }", json!({}), "scalar"),
            ("subscription { subscribe(name: \"a\") { other } }", json!({}), "'other' in type 'Channel'"),
            ("subscription { subscribe { name } }", json!({}), "Missing field argument 'name'"),
            ("subscription { subscribe(name: 3) { name } }", json!({}), "Expected a value"),
            ("subscription { subscribe(name: \"a\", x: 1) { name } }", json!({}), "argument 'x'"),
            ("subscription { a: subscribe(name: \"a\") { name } b: subscribe(name: \"b\") { name } }", json!({}), "exactly one field"),
            ("subscription($n: String!) { subscribe(name: $m) { name } }", json!({"n": "x"}), "'$m' is not defined"),
            ("subscription($n: Int!) { subscribe(name: $n) { name } }", json!({"n": 1}), "expecting 'String!'"),
            ("subscription($n: String!) { subscribe(name: $n) { name } }", json!({}), "invalid value"),
            ("subscription($n: String) { subscribe(name: $n) { name } }", json!({"n": null}), "non-null"),
            ("mutation { publish(name: \"a\", data: \"not json\") { name } }", json!({}), "valid JSON"),
            ("mutation($d: AWSJSON!) { publish(name: \"a\", data: $d) { name } }", json!({"d": {"a": 1}}), "AWSJSON must be a string"),
            ("mutation { publish(name: \"a\") { name } }", json!({}), "'data'"),
            ("subscription { subscribe(name: \"a\") { d1: data d2: data } }", json!({}), "once"),
            ("subscription { subscribe(name: \"a\") { ...F } } fragment F on Channel { ...F }", json!({}), "spreads itself"),
            ("subscription { subscribe(name: \"a\") { ...G } }", json!({}), "Undefined fragment"),
            ("subscription { subscribe(name: \"a\") { ... on Query { __typename } } }", json!({}), "cannot be spread"),
            ("subscription { subscribe(name: \"a\") { ... on Nope { __typename } } }", json!({}), "Unknown type"),
            ("subscription { subscribe(name: \"a\") { name @deprecated } }", json!({}), "Unsupported directive"),
            ("query { __schema { types { name } } }", json!({}), "Introspection"),
            ("subscription { x: subscribe(name: \"a\") { name } x: subscribe(name: \"b\") { name } }", json!({}), "conflict"),
            ("subscription { subscribe(name: \"a\") { n: name n: data } }", json!({}), "conflict"),
            ("mutation($d: AWSJSON! = \"{\") { publish(name: \"a\", data: $d) { name } }", json!({}), "default value"),
        ];
        for (q, vars, want) in cases {
            let e = err(q, vars.clone());
            assert!(e.message.contains(want), "{q}: {e:?}");
        }
        let e = err(
            &format!("query {{ {} }}", "__typename ".repeat(5000)),
            json!({}),
        );
        assert!(e.message.contains("larger than"), "{e:?}");
        let many = (0..11)
            .map(|i| format!("p{i}: publish(name: \"a\", data: \"1\") {{ name }}"))
            .collect::<Vec<_>>()
            .join(" ");
        assert!(err(&format!("mutation {{ {many} }}"), json!({}))
            .message
            .contains("At most"));
        let bad_vars = parse(&req("query { __typename }", json!([1]))).unwrap_err();
        assert_eq!(bad_vars.error_type, "BadRequestException");
        let deep = format!(
            "query {{ {}__typename{} }}",
            "... on Query { ".repeat(200),
            " }".repeat(200)
        );
        assert!(parse(&req(&deep, json!({}))).is_err());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn never_panics(q in ".{0,300}", name in ".{0,20}") {
                let _ = parse(&req(&q, json!({ "name": name, "data": q })));
            }

            #[test]
            fn graphql_shaped_input_never_panics(
                parts in proptest::collection::vec(prop_oneof![
                    Just("subscription"), Just("mutation"), Just("query"), Just("{"), Just("}"),
                    Just("subscribe"), Just("publish"), Just("(name: $n)"), Just("(name: \"x\", data: \"1\")"),
                    Just("name"), Just("data"), Just("__typename"), Just("...F"), Just("fragment F on Channel"),
                    Just("... on Channel"), Just("@skip(if: true)"), Just("($n: String!)"), Just("a:"),
                ], 0..30)
            ) {
                let q = parts.join(" ");
                let _ = parse(&req(&q, json!({ "n": "x" })));
            }
        }
    }
}
