//! Reading one node's table of the XNNGraph flatbuffer: its scalar, dims and value-id
//! fields by schema field id, each error naming the node and field
//! (`xnodes[12].Conv2d.filter_id`). The node kinds of `nodes` say which fields they have.

use std::collections::HashMap;

use etch_format::flatbuf::{FieldPath, Table};
use etch_kernels::BackendError;

use crate::dims::{Dims, MAX_DIMS};
use crate::graph::{NodeDef, Params, Window, invalid};
use crate::schema::{INVALID_VALUE_ID, NodeKind};

/// The table of node `i` (of `kind`), with the map that resolves its value ids.
pub(crate) struct NodeReader<'a, 't> {
    /// Index of the node in `xnodes`.
    pub(crate) i: usize,
    pub(crate) kind: NodeKind,
    pub(crate) table: Table<'t>,
    /// Value index of each serialized value id.
    pub(crate) index_of: &'a HashMap<u32, usize>,
}

impl NodeReader<'_, '_> {
    /// The error path of this node's field `name`.
    pub(crate) fn field(&self, name: &str) -> String {
        format!("xnodes[{}].{}.{name}", self.i, self.kind.name())
    }

    /// A `u32` field (0 when absent).
    pub(crate) fn u32(&self, id: u16, name: &'static str) -> Result<u32, BackendError> {
        let p = FieldPath::Root.field(name);
        self.table
            .scalar::<u32>(id, 0, &p)
            .map_err(|e| invalid(self.field(name), e.to_string()))
    }

    /// A `u32` field as a `usize`.
    pub(crate) fn usize(&self, id: u16, name: &'static str) -> Result<usize, BackendError> {
        self.u32(id, name).map(|v| v as usize)
    }

    /// An `f32` field (0 when absent).
    pub(crate) fn f32(&self, id: u16, name: &'static str) -> Result<f32, BackendError> {
        let p = FieldPath::Root.field(name);
        self.table
            .scalar::<f32>(id, 0.0, &p)
            .map_err(|e| invalid(self.field(name), e.to_string()))
    }

    /// A required `[u32]` field as dims.
    pub(crate) fn dims(&self, id: u16, name: &'static str) -> Result<Dims, BackendError> {
        let p = FieldPath::Root.field(name);
        let v = self
            .table
            .vector::<u32>(id, MAX_DIMS + 1, &p)
            .map_err(|e| invalid(self.field(name), e.to_string()))?
            .ok_or_else(|| invalid(self.field(name), "missing"))?;
        let raw: Vec<usize> = v.iter().map(|d| d as usize).collect();
        Dims::new(&raw).ok_or_else(|| invalid(self.field(name), "too many dims"))
    }

    /// A value id field resolved to a value index.
    pub(crate) fn value(&self, id: u16, name: &'static str) -> Result<usize, BackendError> {
        let raw = self.u32(id, name)?;
        self.index_of.get(&raw).copied().ok_or_else(|| {
            invalid(
                self.field(name),
                format!("value id {raw} is not defined in xvalues"),
            )
        })
    }

    /// An optional value id (`XNN_INVALID_VALUE_ID` means none).
    pub(crate) fn opt_value(
        &self,
        id: u16,
        name: &'static str,
    ) -> Result<Option<usize>, BackendError> {
        if self.u32(id, name)? == INVALID_VALUE_ID {
            Ok(None)
        } else {
            self.value(id, name).map(Some)
        }
    }

    /// The `flags` field (`id`), refused when it sets bits outside `allowed`.
    pub(crate) fn flags(&self, id: u16, allowed: u32) -> Result<u32, BackendError> {
        let flags = self.u32(id, "flags")?;
        if flags & !allowed != 0 {
            return Err(invalid(
                self.field("flags"),
                format!("unsupported flag bits {:#x}", flags & !allowed),
            ));
        }
        Ok(flags)
    }

    /// A one-input node's `input_id`, `output_id` and `flags` (fields `id`, `id + 1`
    /// and `id + 2`, flags within `allowed`) into `node`.
    pub(crate) fn one_input(
        &self,
        node: &mut NodeDef,
        id: u16,
        allowed: u32,
    ) -> Result<(), BackendError> {
        node.inputs = vec![Some(self.value(id, "input_id")?)];
        node.outputs = vec![self.value(id + 1, "output_id")?];
        node.flags = self.flags(id + 2, allowed)?;
        Ok(())
    }

    /// The geometry of a convolution (`conv`: `_XNNNodeConv`) or a pooling node
    /// (`_XNNPooling2D`), each extent checked.
    pub(crate) fn window(&self, conv: bool) -> Result<Window, BackendError> {
        let mut w = Window {
            pad_top: self.usize(0, "padding_top")?,
            pad_right: self.usize(1, "padding_right")?,
            pad_bottom: self.usize(2, "padding_bottom")?,
            pad_left: self.usize(3, "padding_left")?,
            ..Window::default()
        };
        if conv {
            w.kernel_h = self.usize(4, "kernel_height")?;
            w.kernel_w = self.usize(5, "kernel_width")?;
            w.stride_h = self.usize(6, "subsampling_height")?;
            w.stride_w = self.usize(7, "subsampling_width")?;
            w.dilation_h = self.usize(8, "dilation_height")?;
            w.dilation_w = self.usize(9, "dilation_width")?;
            w.group_in = self.usize(10, "group_input_channels")?;
            w.group_out = self.usize(11, "group_output_channels")?;
            w.groups = self.usize(12, "groups")?;
            w.adjust_h = self.usize(13, "adjustment_height")?;
            w.adjust_w = self.usize(14, "adjustment_width")?;
            for (v, name) in [
                (w.groups, "groups"),
                (w.group_in, "group_input_channels"),
                (w.group_out, "group_output_channels"),
            ] {
                if v == 0 || v > 1 << 24 {
                    return Err(invalid(self.field(name), format!("{v} is out of range")));
                }
            }
        } else {
            w.kernel_h = self.usize(4, "pooling_height")?;
            w.kernel_w = self.usize(5, "pooling_width")?;
            w.stride_h = self.usize(6, "stride_height")?;
            w.stride_w = self.usize(7, "stride_width")?;
            // Average pooling serializes dilation 0 ("unused").
            w.dilation_h = self.usize(8, "dilation_height")?.max(1);
            w.dilation_w = self.usize(9, "dilation_width")?.max(1);
        }
        let limit = 1 << 16;
        for (v, name) in [
            (w.kernel_h, "kernel_height"),
            (w.kernel_w, "kernel_width"),
            (w.stride_h, "subsampling_height"),
            (w.stride_w, "subsampling_width"),
            (w.dilation_h, "dilation_height"),
            (w.dilation_w, "dilation_width"),
        ] {
            if v == 0 || v > limit {
                return Err(invalid(self.field(name), format!("{v} is out of range")));
            }
        }
        for (v, name) in [
            (w.pad_top, "padding_top"),
            (w.pad_right, "padding_right"),
            (w.pad_bottom, "padding_bottom"),
            (w.pad_left, "padding_left"),
            (w.adjust_h, "adjustment_height"),
            (w.adjust_w, "adjustment_width"),
        ] {
            if v > limit {
                return Err(invalid(self.field(name), format!("{v} is out of range")));
            }
        }
        Ok(w)
    }
}

impl NodeReader<'_, '_> {
    /// A node of this kind with no operands yet, clamping its output to
    /// `[output_min, output_max]`.
    pub(crate) fn blank(&self, output_min: f32, output_max: f32) -> NodeDef {
        NodeDef {
            kind: self.kind,
            inputs: Vec::new(),
            outputs: Vec::new(),
            flags: 0,
            output_min,
            output_max,
            params: Params::None,
        }
    }
}
